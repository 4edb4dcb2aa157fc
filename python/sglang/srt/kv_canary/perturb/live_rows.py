"""The batch rows a perturbation may target, from the ForwardBatch's CPU-side lengths only."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRow:
    """One request row of a forward; positions ``[0, prefix_len)`` are verified by it."""

    row: int  # index in the batch
    prefix_len: int
    rid: str


def live_rows(forward_batch: ForwardBatch) -> list[LiveRow]:
    """Every request row with its prefix length, without touching device memory.

    DECODE rows verify ``seq_lens - 1`` positions (``seq_lens_cpu``); EXTEND and MIXED rows
    their ``extend_prefix_lens_cpu``. Called on the unpadded batch ``ModelRunner.forward``
    receives.

    Raises:
        ValueError: the CPU-side lengths are missing, or the mode has no request rows.
    """
    mode = forward_batch.forward_mode
    if mode == ForwardMode.DECODE:
        if forward_batch.seq_lens_cpu is None:
            raise ValueError(
                "KV canary perturbation needs ForwardBatch.seq_lens_cpu in DECODE mode"
            )
        prefix_lens = [int(n) - 1 for n in forward_batch.seq_lens_cpu.tolist()]
    elif mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
        if forward_batch.extend_prefix_lens_cpu is None:
            raise ValueError(
                "KV canary perturbation needs ForwardBatch.extend_prefix_lens_cpu in "
                f"{mode.name} mode"
            )
        prefix_lens = [int(n) for n in forward_batch.extend_prefix_lens_cpu]
    else:
        raise ValueError(f"KV canary perturbation: forward mode {mode.name} has no request rows")
    rids = forward_batch.rids or []
    return [
        LiveRow(row=index, prefix_len=length, rid=rids[index] if index < len(rids) else "?")
        for index, length in enumerate(prefix_lens)
    ]
