"""The self-check's token-oracle sampler, with a next-token fault in the spirit of next_token_swap.

:class:`OracleSampler` emits what SGLang's ``token_oracle`` sampling backend emits: the token
oracle's token at the next position of each request (generalized id = the rid's hash; the
simulated requests have no bootstrap room). With a :class:`ForeignTokenFault`, after its warm-up
and with its probability per sampling step, one request is fed another request's oracle token
instead of its own: the scheduler then records it as the request's output and feeds it back as
the next input, so the KV cache and the history stay consistent with it and only the write-input
assert (its token is not the oracle's) may fire. Each fault logs one ``kv_canary perturb:`` line::

    kv_canary perturb: fault=foreign_next_token step=<forward> row=<i> rid=<rid> \
position=<p> partner_row=<j> partner_rid=<rid> partner_position=<q>

where ``position`` is where the request consumes the wrong token (the write check's position)
and ``step`` is the forward after which it was sampled: the request consumes it in a later
forward. Only requests that will consume their token (not finishing with it) are chosen.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_PREFIX
from sglang.srt.kv_canary.token_oracle.request_ids import stable_hash_str_to_i64
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedRequest
from sglang.srt.kv_canary.token_oracle.oracle import hash_oracle_token_scalar

logger = logging.getLogger(__name__)

FOREIGN_TOKEN_FAULT = "foreign_next_token"


@dataclass(slots=True, kw_only=True)
class ForeignTokenFault:
    """Seeded choice of the sampling steps where a request gets another request's token."""

    probability: float
    warmup_steps: int
    seed: int
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


class OracleSampler:
    """The oracle's next tokens (see the module docstring)."""

    def __init__(self, *, vocab_size: int, fault: ForeignTokenFault | None = None) -> None:
        self._vocab_size = vocab_size
        self._fault = fault

    def oracle_token(self, request: SimulatedRequest, position: int) -> int:
        """The oracle's token of ``request`` at ``position``."""
        return hash_oracle_token_scalar(
            generalized_req_id=stable_hash_str_to_i64(request.rid),
            position=position,
            vocab_size=self._vocab_size,
        )

    def sample(self, rows: Sequence[tuple[SimulatedRequest, int]], *, step: int) -> list[int]:
        tokens = [self.oracle_token(request, position + 1) for request, position in rows]
        if self._fault is not None:
            self._maybe_feed_foreign_token(rows, tokens, step=step)
        return tokens

    def _maybe_feed_foreign_token(
        self, rows: Sequence[tuple[SimulatedRequest, int]], tokens: list[int], *, step: int
    ) -> None:
        fault = self._fault
        if step < fault.warmup_steps or len(rows) < 2 or fault.rng.random() >= fault.probability:
            return
        consumers = [
            index for index, (request, _) in enumerate(rows)
            if len(request.output) + 1 < request.max_new_tokens  # it will consume this token
        ]
        if not consumers:
            return
        row = fault.rng.choice(consumers)
        partner = fault.rng.choice([index for index in range(len(rows)) if index != row])
        if tokens[partner] == tokens[row]:
            return  # the same token: nothing would be wrong
        tokens[row] = tokens[partner]
        request, position = rows[row]
        other, other_position = rows[partner]
        logger.info(
            f"{PERTURB_LINE_PREFIX} fault={FOREIGN_TOKEN_FAULT} step={step} row={row} "
            f"rid={request.rid} position={position + 1} partner_row={partner} "
            f"partner_rid={other.rid} partner_position={other_position + 1}"
        )
