"""``input_ids`` perturbation: one live row's input token is replaced right before the forward.

Models a scheduler / overlap / speculative bug that feeds the model a token the request does
not have. The model then stores the K/V of the wrong token, and the canary's record of that slot
says so consistently (the record is written from the same ``input_ids``), so the chain and
position checks stay silent: only the token checks can see it, the write-input assert in the
same forward (``write_token``: the oracle's token for a decode row, the request's own token,
sent with the batch, for a prompt token) and verify-token in every later forward that verifies the slot (``verify_token``).

The choice uses the batch's CPU-side lengths only: a decode row's single token, or a uniformly
chosen new token of an extend row. The token becomes ``(token + delta) mod vocab_size`` with a
seeded ``delta`` in ``[1, vocab_size)``, so it always changes and stays a valid id; the device
value is never read on the host. ``forward_batch.input_ids`` is perturbed in place, before
``ModelRunner.forward``: a replayed decode graph copies it into its static buffer while
preparing the replay, so graph-replayed forwards consume the wrong token too. The undo restores
the forward batch's tensor after the forward (the KV and the record keep the wrong token: that
is the fault).
"""

from __future__ import annotations

import random

from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.live_rows import LiveRow
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


def new_token_ranges(forward_batch: ForwardBatch, rows: list[LiveRow]) -> list[tuple[int, int]]:
    """``(first token index, token count)`` of each row's new tokens in ``input_ids``.

    DECODE: token ``row``, one each. EXTEND / MIXED: consecutive ranges of
    ``extend_seq_lens_cpu`` (CPU lengths; no device access).

    Raises:
        ValueError: an extend batch without ``extend_seq_lens_cpu``.
    """
    if forward_batch.forward_mode == ForwardMode.DECODE:
        return [(row.row, 1) for row in rows]
    lengths = forward_batch.extend_seq_lens_cpu
    if lengths is None:
        raise ValueError(
            "KV canary input_ids perturbation needs ForwardBatch.extend_seq_lens_cpu in "
            f"{forward_batch.forward_mode.name} mode"
        )
    counts = [int(n) for n in lengths]
    starts = [sum(counts[:index]) for index in range(len(counts))]
    return [(starts[row.row], counts[row.row]) for row in rows]


def pick_new_token(
    forward_batch: ForwardBatch, rows: list[LiveRow], rng: random.Random
) -> tuple[LiveRow, int, int] | None:
    """A uniformly chosen row with new tokens, then one of its new tokens: ``(row, offset among
    the row's new tokens, index in input_ids)``; None when no row writes a token."""
    candidates = [
        (row, first, count)
        for row, (first, count) in zip(rows, new_token_ranges(forward_batch, rows))
        if count > 0
    ]
    if not candidates:
        return None
    row, first, count = rng.choice(candidates)
    offset = rng.randrange(count)
    return row, offset, first + offset


class InputIdsPerturbation:
    """Shifts one new input token of one live row by a seeded non-zero delta, for one forward."""

    kind = "input_ids"

    def __init__(self, *, vocab_size: int) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size={vocab_size} is invalid; allowed: an integer >= 2")
        self._vocab_size = vocab_size

    def inject(
        self, *, forward_batch: ForwardBatch, rows: list[LiveRow], rng: random.Random,
        step: int,
    ) -> InjectedFault | None:
        picked = pick_new_token(forward_batch, rows, rng)
        if picked is None:
            return None
        row, offset, token_index = picked
        delta = rng.randrange(1, self._vocab_size)
        token = forward_batch.input_ids[token_index : token_index + 1]  # a view
        saved = token.clone()
        token.add_(delta).remainder_(self._vocab_size)
        return InjectedFault(
            fault=self.kind,
            row=row,
            position=row.prefix_len + offset,
            detail=f"token_index={token_index} delta={delta}",
            undo=lambda: token.copy_(saved),
        )
