"""next_token_swap: swap two requests' sampled tokens at the oracle sampler's exit.

The KV cache stays consistent (each request then consumes the other's token as its next input,
through the normal write path), so among the canary's checks only the write-input assert may
fire (``write_token`` on the next decode step of both requests).

Counting and randomness: every call of the ``token_oracle`` sampler is one step (the sampler
samples once per scheduler step that samples; EAGLE verify and draft forwards do not go through
it). Steps ``< warmup_steps`` are never perturbed. After that, with probability ``p`` per step,
two distinct rows are drawn and their tokens swapped. A batch of one row is left untouched and
draws nothing. All draws come from one ``random.Random(seed)``, so the same sequence of batch
sizes gives the same swaps (and every TP rank makes the same choice). Each swap logs one INFO
line in the ``kv_canary perturb:`` format of :mod:`sglang.srt.kv_canary.perturb.fault`::

    kv_canary perturb: fault=next_token_swap step=<sampler call> row=<i> rid=<rid> \
position=<p> partner_row=<j> partner_rid=<rid> partner_position=<q>

where ``position`` is the position of the token the row sampled (its ``seq_lens_cpu``), so a
test can predict the outputs exactly: the request of row ``i`` emits, at position ``p``, the
oracle token of the partner at ``q``, and vice versa.

The swap itself is two indexed copies on the device (no host sync).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_PREFIX

logger = logging.getLogger(__name__)

FAULT_NAME = "next_token_swap"


@dataclass(frozen=True, slots=True, kw_only=True)
class SampledRows:
    """Host-side description of the rows of one sampling call, for the swap's log line.

    Attributes:
        rids: the request id of each row.
        next_positions: CPU tensor ``[rows]``: the position of the token each row samples
            (the batch's ``seq_lens_cpu``), or None when the batch has no CPU lengths.
    """

    rids: Sequence[str]
    next_positions: torch.Tensor | None

    def describe(self, row: int) -> tuple[str, str]:
        """``(rid, position)`` of ``row`` as log text ("?" where unknown)."""
        rid = self.rids[row] if row < len(self.rids) else "?"
        if self.next_positions is None or row >= self.next_positions.shape[0]:
            return rid, "?"
        return rid, str(int(self.next_positions[row]))


@dataclass(slots=True, kw_only=True)
class NextTokenSwapState:
    """The swap's configuration, step counter and random generator (one per sampler)."""

    probability: float
    warmup_steps: int
    rng: random.Random
    steps_seen: int = field(default=0)

    @classmethod
    def from_config(cls, perturb: PerturbConfig) -> NextTokenSwapState | None:
        """None when ``next_token_swap_prob`` is 0 (nothing to do, nothing drawn)."""
        if perturb.next_token_swap_prob <= 0.0:
            return None
        return cls(
            probability=perturb.next_token_swap_prob,
            warmup_steps=perturb.warmup_steps,
            rng=random.Random(perturb.seed),
        )


def maybe_perturb_swap_next_tokens(
    *,
    next_token_ids: torch.Tensor,
    sampled_rows: SampledRows | None,
    state: NextTokenSwapState,
) -> torch.Tensor:
    """Count one sampling step and, after the warm-up, maybe swap two rows' tokens.

    Args:
        next_token_ids: ``[rows]`` sampled tokens (any integer dtype, any device).
        sampled_rows: the rows' rids and positions, for the log line only.
        state: the swap's state; ``steps_seen`` is incremented on every call.
    Returns:
        ``next_token_ids`` itself when nothing is swapped, else a new tensor with rows ``i`` and
        ``j`` exchanged. No host sync.
    """
    step = state.steps_seen
    state.steps_seen += 1
    rows = next_token_ids.shape[0]
    if step < state.warmup_steps or rows < 2 or state.rng.random() >= state.probability:
        return next_token_ids
    row, partner = state.rng.sample(range(rows), 2)
    swapped = next_token_ids.clone()
    swapped[row] = next_token_ids[partner]
    swapped[partner] = next_token_ids[row]
    described = sampled_rows or SampledRows(rids=(), next_positions=None)
    rid, position = described.describe(row)
    partner_rid, partner_position = described.describe(partner)
    logger.info(
        f"{PERTURB_LINE_PREFIX} fault={FAULT_NAME} step={step} row={row} rid={rid} "
        f"position={position} partner_row={partner} partner_rid={partner_rid} "
        f"partner_position={partner_position}"
    )
    return swapped
