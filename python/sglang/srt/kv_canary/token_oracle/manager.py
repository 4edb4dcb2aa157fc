"""What the oracle says a forward consumes, and what the sampler emits.

:class:`TokenOracleManager` is the one object the sampler and the in-forward checks share, so
they agree by construction:

* :meth:`~TokenOracleManager.sample_next_tokens`: the token after the logits' position, i.e.
  the oracle at ``position + 1``;
* :meth:`~TokenOracleManager.fill_expected_inputs`: for every token of a forward, the input
  token and position the model should consume, written into caller-preallocated
  :class:`ExpectedInputs` (:data:`NO_EXPECTATION` where the oracle predicts nothing).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang.srt.kv_canary.token_oracle.request_ids import (
    generalized_req_ids_of,
    request_ids_of,
)
from sglang.srt.kv_canary.token_oracle.oracle import TokenOracle

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

NO_EXPECTATION = -1  # an entry the oracle makes no prediction for


class _BlockTokenRule(enum.Enum):
    """Which tokens of a block of consecutive positions the oracle predicts."""

    EVERY_TOKEN = enum.auto()  # decode: the input token at each position
    FIRST_TOKEN = enum.auto()  # target verify: the bonus token only; drafts are not oracle's
    ACCEPTED_NEXT_TOKENS = enum.auto()  # draft extend: token at position + 1, accepted ones only


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectedInputs:
    """Preallocated per-token expectations of one forward.

    Attributes:
        tokens: int64 ``[capacity]``: the expected input token, or :data:`NO_EXPECTATION`.
        positions: int64 ``[capacity]``: the expected position, or :data:`NO_EXPECTATION`.

    :meth:`TokenOracleManager.fill_expected_inputs` writes entries ``[:num_tokens]`` of a
    forward; entries past that keep their old values.
    """

    tokens: torch.Tensor
    positions: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("tokens", "positions"):
            tensor = getattr(self, name)
            if tensor.dtype != torch.int64 or tensor.dim() != 1:
                raise ValueError(
                    f"ExpectedInputs.{name} must be a 1-D int64 tensor, got {tensor.dtype} "
                    f"with shape {tuple(tensor.shape)}"
                )
        if self.tokens.shape != self.positions.shape or self.tokens.device != self.positions.device:
            raise ValueError(
                f"ExpectedInputs.tokens {tuple(self.tokens.shape)} on {self.tokens.device} and "
                f"positions {tuple(self.positions.shape)} on {self.positions.device} must match"
            )

    @classmethod
    def allocate(cls, *, capacity: int, device: torch.device | str) -> ExpectedInputs:
        """Both buffers filled with :data:`NO_EXPECTATION`."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity={capacity!r} is invalid; allowed: an integer >= 1")
        return cls(
            tokens=torch.full((capacity,), NO_EXPECTATION, dtype=torch.int64, device=device),
            positions=torch.full((capacity,), NO_EXPECTATION, dtype=torch.int64, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.tokens.shape[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenOracleManager:
    """The sampler's and the checks' shared view of one :class:`TokenOracle`."""

    oracle: TokenOracle

    def sample_next_tokens(
        self, *, generalized_req_ids: torch.Tensor, logits_positions: torch.Tensor
    ) -> torch.Tensor:
        """The token each row samples: the oracle at ``logits_positions + 1``.

        The logits at position ``p`` predict the token the model consumes at ``p + 1``.

        Args:
            generalized_req_ids: int64 ``[n]``.
            logits_positions: ``[n]``, int32 or int64: the position of the token whose logits
                are sampled.
        Returns:
            int32 ``[n]``. No host sync.
        """
        return self._sample(req_ids=generalized_req_ids, bootstrap_room_ids=None,
                            logits_positions=logits_positions)

    def sample_next_tokens_by_request(
        self, *, rids_int: torch.Tensor, bootstrap_room_ids_int: torch.Tensor,
        logits_positions: torch.Tensor,
    ) -> torch.Tensor:
        """:meth:`sample_next_tokens` of the rows' generalized ids, selected from ``rids_int``
        and ``bootstrap_room_ids_int`` (int64 ``[n]``) in the same launch. No host sync."""
        return self._sample(req_ids=rids_int, bootstrap_room_ids=bootstrap_room_ids_int,
                            logits_positions=logits_positions)

    def write_next_tokens_by_request(
        self, *, rids_int: torch.Tensor, bootstrap_room_ids_int: torch.Tensor,
        logits_positions: torch.Tensor, tokens_out: torch.Tensor,
    ) -> None:
        """:meth:`sample_next_tokens_by_request` into the caller's int32 ``tokens_out``
        (``[n]``). One launch, no allocation, no host sync: CUDA-graph capturable (the decode
        graphs compute their rows' next tokens with it, see :mod:`.graph_tokens`)."""
        self.oracle.write_tokens(
            req_ids=rids_int, bootstrap_room_ids=bootstrap_room_ids_int,
            positions=logits_positions, position_offset=1, tokens_out=tokens_out,
        )

    def _sample(
        self, *, req_ids: torch.Tensor, bootstrap_room_ids: torch.Tensor | None,
        logits_positions: torch.Tensor,
    ) -> torch.Tensor:
        tokens = torch.empty(
            logits_positions.shape, dtype=torch.int32, device=logits_positions.device
        )
        self.oracle.write_tokens(
            req_ids=req_ids, bootstrap_room_ids=bootstrap_room_ids, positions=logits_positions,
            position_offset=1, tokens_out=tokens,
        )
        return tokens

    def fill_expected_inputs(
        self, *, forward_batch: ForwardBatch, expected_inputs_out: ExpectedInputs
    ) -> int:
        """Write the expected input token and position of every token of ``forward_batch``.

        Per forward mode (``_original_forward_mode`` wins where DP-attention padding turned a
        decode-like batch into EXTEND), with ``r`` a row and ``j`` its token index:

        * DECODE (target): position ``seq_lens[r] - 1``, token ``oracle(id_r, that position)``;
        * DECODE of an EAGLE draft model (``spec_info`` is a draft input): no expectation (draft
          tokens are not oracle tokens);
        * TARGET_VERIFY (EAGLE chain, ``topk == 1``; blocks of ``draft_token_num``): position
          ``seq_lens[r] + j``; token ``oracle(id_r, seq_lens[r])`` for ``j == 0`` (the bonus
          token), no expectation for the draft tokens;
        * DRAFT_EXTEND_V2 (blocks of ``num_tokens_per_req``): position ``seq_lens[r] - block +
          j``; token ``oracle(id_r, position + 1)`` (a draft slot holds the token one position
          ahead) for ``j < num_accept_tokens[r]``, no expectation past the accepted tokens;
        * EXTEND, MIXED, SPLIT_PREFILL: position ``extend_prefix_lens[r] + j``; no token
          expectation (prompt tokens are not oracle tokens: the request's history is the
          reference there);
        * IDLE: nothing.

        Tokens past the rows' blocks (DP-attention padding) get no expectation. Ids come from
        ``forward_batch.rids_int`` / ``bootstrap_room_ids_int`` (graph-resident static buffers
        inside a captured CUDA graph).

        Graph safety: fixed shapes from host metadata only, no host sync, no data-dependent
        shapes; temporaries come from the graph pool when captured.

        Returns:
            The number of entries written, ``forward_batch.positions.shape[0]``.
        Raises:
            ValueError: an unsupported forward mode, an EAGLE tree (``topk > 1``), a shape that
                does not match the mode, or more tokens than ``expected_inputs_out.capacity``.
            MissingRequestIdsError: the batch has no per-request ids.
        """
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        mode = getattr(forward_batch, "_original_forward_mode", None) or forward_batch.forward_mode
        if mode == ForwardMode.IDLE:
            return 0
        num_tokens = forward_batch.positions.shape[0]
        if num_tokens > expected_inputs_out.capacity:
            raise ValueError(
                f"the forward has {num_tokens} tokens but expected_inputs_out holds "
                f"{expected_inputs_out.capacity}"
            )
        tokens_out = expected_inputs_out.tokens[:num_tokens]
        positions_out = expected_inputs_out.positions[:num_tokens]
        spec_info = forward_batch.spec_info

        if mode == ForwardMode.DECODE and spec_info is not None and spec_info.is_draft_input():
            tokens_out.fill_(NO_EXPECTATION)
            positions_out.fill_(NO_EXPECTATION)
        elif mode == ForwardMode.DECODE:
            self._fill_blocks(forward_batch=forward_batch, block=1, first_position_offset=-1,
                              tokens_out=tokens_out, positions_out=positions_out,
                              token_rule=_BlockTokenRule.EVERY_TOKEN)
        elif mode == ForwardMode.TARGET_VERIFY:
            if spec_info.topk != 1:
                raise ValueError(
                    f"fill_expected_inputs supports EAGLE chains (speculative topk 1), got topk "
                    f"{spec_info.topk}: tree positions are not block-uniform"
                )
            self._fill_blocks(forward_batch=forward_batch, block=spec_info.draft_token_num,
                              first_position_offset=0, tokens_out=tokens_out,
                              positions_out=positions_out,
                              token_rule=_BlockTokenRule.FIRST_TOKEN)
        elif mode == ForwardMode.DRAFT_EXTEND_V2:
            block = spec_info.num_tokens_per_req
            self._fill_blocks(forward_batch=forward_batch, block=block,
                              first_position_offset=-block, tokens_out=tokens_out,
                              positions_out=positions_out,
                              token_rule=_BlockTokenRule.ACCEPTED_NEXT_TOKENS)
        elif mode in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.SPLIT_PREFILL):
            _fill_extend_positions(forward_batch=forward_batch, positions_out=positions_out)
            tokens_out.fill_(NO_EXPECTATION)
        else:
            raise ValueError(
                f"fill_expected_inputs does not support forward mode {mode.name}; supported: "
                "IDLE, DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2, EXTEND, MIXED, SPLIT_PREFILL"
            )
        return num_tokens

    def _fill_blocks(
        self,
        *,
        forward_batch: ForwardBatch,
        block: int,
        first_position_offset: int,
        tokens_out: torch.Tensor,
        positions_out: torch.Tensor,
        token_rule: _BlockTokenRule,
    ) -> None:
        """Rows of ``block`` tokens at positions ``seq_lens[r] + first_position_offset + j``."""
        rows = forward_batch.batch_size
        covered = rows * block
        if covered > tokens_out.shape[0]:
            raise ValueError(
                f"{forward_batch.forward_mode.name} batch: {rows} rows of {block} tokens need "
                f"{covered} tokens but the forward has {tokens_out.shape[0]}"
            )
        tokens = tokens_out[:covered].view(rows, block)
        positions = positions_out[:covered].view(rows, block)
        if token_rule is _BlockTokenRule.EVERY_TOKEN:
            # The oracle writes each column's tokens and positions: one launch per column (a
            # decode batch has one), the generalized ids selected inside it.
            rids_int, rooms = request_ids_of(forward_batch)
            for j in range(block):
                self.oracle.write_tokens(
                    req_ids=rids_int[:rows], bootstrap_room_ids=rooms[:rows],
                    positions=forward_batch.seq_lens[:rows],
                    position_offset=first_position_offset + j,
                    tokens_out=tokens[:, j], positions_out=positions[:, j],
                )
        else:
            ids = generalized_req_ids_of(forward_batch)[:rows]
            first = forward_batch.seq_lens[:rows].to(torch.int64) + first_position_offset
            offsets = torch.arange(block, dtype=torch.int64, device=first.device)
            positions.copy_(first[:, None] + offsets[None, :])
            if token_rule is _BlockTokenRule.FIRST_TOKEN:
                tokens[:, 1:].fill_(NO_EXPECTATION)
                tokens[:, 0].copy_(self.oracle.expected_tokens(generalized_req_ids=ids,
                                                               positions=first))
            else:
                num_accept_tokens = forward_batch.spec_info.num_accept_tokens
                if num_accept_tokens is None:
                    raise ValueError(
                        "DRAFT_EXTEND_V2 batch without spec_info.num_accept_tokens"
                    )
                predicted = self.oracle.expected_tokens(
                    generalized_req_ids=ids[:, None].expand(rows, block).contiguous(),
                    positions=positions + 1,
                )
                accepted = offsets[None, :] < num_accept_tokens[:rows, None]
                tokens.copy_(torch.where(accepted, predicted.to(torch.int64), NO_EXPECTATION))
        tokens_out[covered:].fill_(NO_EXPECTATION)
        positions_out[covered:].fill_(NO_EXPECTATION)


def _fill_extend_positions(*, forward_batch: ForwardBatch, positions_out: torch.Tensor) -> None:
    """``extend_prefix_lens[r] + j`` for token ``j`` of row ``r``; padding tokens get -1.

    The owning row of each token is found with ``searchsorted`` over the cumulative extend
    lengths: fixed shapes, no host sync (``repeat_interleave`` would need the total on device).
    """
    rows = forward_batch.batch_size
    lengths = forward_batch.extend_seq_lens[:rows].to(torch.int64)
    prefixes = forward_batch.extend_prefix_lens[:rows].to(torch.int64)
    ends = torch.cumsum(lengths, dim=0)
    starts = ends - lengths
    token_index = torch.arange(positions_out.shape[0], dtype=torch.int64, device=ends.device)
    owner = torch.searchsorted(ends, token_index, right=True)
    clamped = owner.clamp(max=rows - 1)
    positions = prefixes[clamped] + (token_index - starts[clamped])
    positions_out.copy_(torch.where(owner < rows, positions, NO_EXPECTATION))
