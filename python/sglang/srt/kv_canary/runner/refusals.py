"""Start-up refusals of server flags: configurations the KV canary cannot check stop the server.

Each refusal names what to change (raised as
:class:`~sglang.srt.kv_canary.errors.CanaryUnsupportedError`). Nothing is ever left silently
unchecked: a configuration the canary does not cover fails at model-runner start-up instead of
serving without protection. Pools the canary does not cover are refused behind the pool seam
(:func:`sglang.srt.kv_canary.pools.pool_refusals`).
"""

from __future__ import annotations

from typing import Any

_SELF_CHECK = "python -m sglang.srt.kv_canary.selfcheck"


def unsupported_server_args(server_args: Any) -> list[str]:
    """Reasons the canary cannot run with these (post-processed) ``ServerArgs``; empty when fine.

    Args:
        server_args: SGLang's ``ServerArgs`` after ``__post_init__`` (read-only access).
    """
    reasons: list[str] = []
    if server_args.device != "cuda":
        reasons.append(
            f"--device {server_args.device}: the canary kernels need a CUDA device "
            f"(to exercise the canary without a GPU run {_SELF_CHECK})"
        )
    reasons += _unsupported_speculative(server_args)
    if not server_args.disable_piecewise_cuda_graph:
        reasons.append(
            "piecewise CUDA graph is enabled (SGLang 0.5.12 enables it by default for prefill) "
            "and its graphs would run without the canary; pass --disable-piecewise-cuda-graph"
        )
    if server_args.enable_torch_compile:
        reasons.append(
            "--enable-torch-compile would compile the canary's forward wrapper; remove it"
        )
    if server_args.pp_size > 1:
        reasons.append(
            f"pipeline parallelism (--pp-size {server_args.pp_size}) is not supported; "
            "use --pp-size 1"
        )
    if server_args.disaggregation_mode != "null":
        reasons.append(
            f"PD disaggregation (--disaggregation-mode {server_args.disaggregation_mode}) is not "
            "supported: canary records do not travel with the KV transfer yet; remove "
            "--disaggregation-mode"
        )
    if server_args.enable_lmcache:
        reasons.append(
            "--enable-lmcache loads KV back into slots without canary records; remove the flag "
            "(--enable-hierarchical-cache is covered)"
        )
    if server_args.enable_hierarchical_cache:
        reasons += _unsupported_hierarchical_cache(server_args)
    if server_args.enable_pdmux:
        reasons.append(
            "--enable-pdmux runs split-prefill forwards, which the canary does not check; remove it"
        )
    if server_args.dllm_algorithm is not None:
        reasons.append(
            f"diffusion LLM decoding (--dllm-algorithm {server_args.dllm_algorithm}) is not "
            "supported; remove --dllm-algorithm"
        )
    return reasons


def _unsupported_hierarchical_cache(server_args: Any) -> list[str]:
    """The hierarchical cache is covered with its host tier (L2), any write policy, layout or
    io backend; not with an L3 storage backend, a host pool sized in GB, or EAGLE."""
    reasons = []
    if server_args.hicache_storage_backend is not None:
        reasons.append(
            f"--hicache-storage-backend {server_args.hicache_storage_backend}: pages prefetched "
            "from an L3 storage backend carry no canary records; remove the flag (the host "
            "tier alone is covered)"
        )
    if server_args.hicache_size:
        reasons.append(
            f"--hicache-size {server_args.hicache_size}: the canary budgets its host-tier "
            "records per device KV token; size the host pool with --hicache-ratio instead"
        )
    if server_args.speculative_algorithm is not None:
        reasons.append(
            "--enable-hierarchical-cache with speculative decoding: the draft pool's host "
            "copies are not covered; remove one of them"
        )
    return reasons


_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3")


def _unsupported_speculative(server_args: Any) -> list[str]:
    """Speculative decoding is checked for EAGLE / EAGLE3 on SGLang's spec-v2 worker (overlap
    schedule on) with chains (topk 1), page size 1, one attention group."""
    algorithm = server_args.speculative_algorithm
    if algorithm is None:
        return []
    name = f"--speculative-algorithm {algorithm}"
    if algorithm not in _SPEC_ALGORITHMS:
        return [
            f"speculative decoding with {name} is not supported (supported: "
            f"{', '.join(_SPEC_ALGORITHMS)}); remove --speculative-algorithm or use EAGLE"
        ]
    reasons = []
    if server_args.disable_overlap_schedule:
        reasons.append(
            f"{name} runs SGLang's spec-v1 EAGLE worker when the overlap schedule is off (or "
            "SGLANG_ENABLE_SPEC_V2=0, or topk > 1); the canary checks the spec-v2 worker only: "
            "keep the overlap schedule and SGLANG_ENABLE_SPEC_V2 on"
        )
    if (server_args.speculative_eagle_topk or 1) != 1:
        reasons.append(
            f"--speculative-eagle-topk {server_args.speculative_eagle_topk}: the canary checks "
            "EAGLE chains only; use --speculative-eagle-topk 1"
        )
    if server_args.enable_multi_layer_eagle:
        reasons.append("multi-layer EAGLE is not supported; use a single-layer EAGLE draft")
    if server_args.page_size not in (None, 1):
        reasons.append(
            f"--page-size {server_args.page_size} with {name}: the canary checks EAGLE with page "
            "size 1 only; use --page-size 1"
        )
    if server_args.enable_dp_attention:
        reasons.append(
            f"--enable-dp-attention with {name} is not supported; remove one of them"
        )
    return reasons
