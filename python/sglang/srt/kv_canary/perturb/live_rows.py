"""The batch rows a perturbation may target, from the ForwardBatch's CPU-side lengths only."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.kv_canary.batch.forward_kind import forward_kind, host_prefix_lens
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRow:
    """One request row of a forward; positions ``[0, prefix_len)`` are verified by it."""

    row: int  # index in the batch
    prefix_len: int
    rid: str


def live_rows(forward_batch: ForwardBatch) -> list[LiveRow]:
    """Every request row with its prefix length, without touching device memory.

    The prefix lengths are :func:`~sglang.srt.kv_canary.batch.forward_kind.host_prefix_lens`
    (DECODE rows ``seq_lens_cpu - 1``, EXTEND and MIXED rows ``extend_prefix_lens_cpu``, EAGLE
    target-verify rows ``seq_lens_cpu``, ...). Called on the unpadded batch
    ``ModelRunner.forward`` receives.

    Raises:
        ValueError: the CPU-side lengths are missing, or the mode has no request rows.
    """
    if forward_kind(forward_batch) is None:
        raise ValueError(
            f"KV canary perturbation: forward mode {forward_batch.forward_mode.name} has no "
            "request rows"
        )
    prefix_lens = host_prefix_lens(forward_batch)
    rids = forward_batch.rids or []
    return [
        LiveRow(row=index, prefix_len=length, rid=rids[index] if index < len(rids) else "?")
        for index, length in enumerate(prefix_lens)
    ]
