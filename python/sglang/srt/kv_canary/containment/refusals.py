"""Server flags abort mode refuses at model-runner start-up (beside the canary's own,
:mod:`sglang.srt.kv_canary.runner.refusals`), each naming what to change."""

from __future__ import annotations

from typing import Any

_INSTEAD = "use SGLANG_KV_CANARY_ON_VIOLATION=log or raise with it"


def abort_mode_refusals(server_args: Any) -> list[str]:
    """Why abort mode cannot run with these ``ServerArgs`` (empty: it can).

    Abort mode decides on one scheduler's host: with several tensor-parallel or data-parallel
    attention ranks every rank would have to take the same decision (an all-reduce over
    ``tp_cpu_group``), which it does not do yet; with speculative decoding a batch's result
    spans several canaries' forwards, which its containment point does not cover yet.
    """
    reasons = []
    if server_args.tp_size > 1:
        reasons.append(f"SGLANG_KV_CANARY_ON_VIOLATION=abort with --tp-size {server_args.tp_size}:"
                       f" the ranks would not take one decision; pass --tp-size 1, or {_INSTEAD}")
    if server_args.enable_dp_attention:
        reasons.append("SGLANG_KV_CANARY_ON_VIOLATION=abort with --enable-dp-attention: the "
                       f"ranks would not take one decision; remove the flag, or {_INSTEAD}")
    if server_args.speculative_algorithm is not None:
        reasons.append(f"SGLANG_KV_CANARY_ON_VIOLATION=abort with --speculative-algorithm "
                       f"{server_args.speculative_algorithm}: not covered yet; {_INSTEAD}")
    if server_args.enable_hierarchical_cache:
        reasons.append("SGLANG_KV_CANARY_ON_VIOLATION=abort with --enable-hierarchical-cache: "
                       "healing does not evict the host copies of suspect pages yet; remove the "
                       f"flag, or {_INSTEAD}")
    return reasons
