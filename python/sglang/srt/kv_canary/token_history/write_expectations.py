"""What the write-input assert expects each written token and position to be.

* decode-like forwards (DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2, SPLIT_PREFILL): computed inside
  the forward (so inside captured CUDA graphs) into a preallocated
  :class:`~sglang.srt.kv_canary.token_oracle.manager.ExpectedInputs`: for decode rows the
  oracle's token at the row's position (from the graph-resident request ids inside a captured
  graph);
* EXTEND / MIXED forwards (eager, never captured): built on the host once the model forward is
  enqueued (the post launch checks an EXTEND layout's written inputs, so they are off the path
  to the first token) by :func:`extend_expectations_on_host` from the scheduler's own lists and
  sent with one copy: each token's position (``extend_prefix_lens[r] + j``), and for a prompt
  position the request's own token from its ``origin_input_ids`` (so extend rows are checked
  against the request, not against themselves), for a *generated* position (>= the prompt length: the decode rows of a
  MIXED batch, the outputs of a retracted request prefilled again) the oracle's token. Building
  them on the host takes the place of about forty small eager torch ops per extend forward.

Off for EAGLE draft-decode forwards (their inputs are draft tokens, and draft slot ``p`` holds
the token of position ``p + 1``).

Graph safety: no host sync and no persistent allocation inside a capture (temporaries come from
the graph's pool). The only allocation after start-up is the one-off growth of an overflow buffer
for an eager forward larger than any seen before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sglang.srt.kv_canary.batch.forward_kind import capturing
from sglang.srt.kv_canary.token_oracle.manager import (
    NO_EXPECTATION,
    ExpectedInputs,
    TokenOracleManager,
)
from sglang.srt.kv_canary.token_oracle.oracle import TokenOracle
from sglang.srt.kv_canary.token_oracle.request_ids import generalized_req_id
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

_EXTEND_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)


def extend_expectations_on_host(
    *,
    reqs: Sequence[Any],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    num_tokens: int,
    oracle: TokenOracle,
    pin_memory: bool,
    prompt_sources: Sequence[Sequence[int] | np.ndarray] | None = None,
) -> torch.Tensor:
    """The write-input expectations of an EXTEND / MIXED batch, on the host.

    Args:
        reqs: the batch's requests, one per row (SGLang's ``Req``: ``origin_input_ids``,
            ``rid``, ``bootstrap_room``).
        prefix_lens / extend_lens: each row's cached prefix and its tokens in this forward
            (``extend_prefix_lens_cpu`` / ``extend_seq_lens_cpu``).
        num_tokens: the forward's token count (``input_ids.shape[0]``).
        oracle: predicts a generated position's token.
        pin_memory: pin the buffer (CUDA: the upload is then asynchronous).
        prompt_sources: per row, what its prompt tokens are copied from: by default its
            ``origin_input_ids``; an int64 array of its whole history (``origin_input_ids +
            output_ids``, already read for the token history) is copied from without reading
            the request's list again.
    Returns:
        int64 ``[2, num_tokens]`` CPU tensor: row 0 the expected token, row 1 the expected
        position of each token, :data:`NO_EXPECTATION` past the rows' tokens (the canary kernel
        takes both rows at any offset without a new specialization). Row ``r``'s token ``j`` is at
        position ``prefix_lens[r] + j``; its token is ``origin_input_ids[position]`` for a prompt
        position, else the oracle's token for the request's generalized id (its bootstrap room
        when it has a valid one, else its hashed rid) at that position.
    """
    host = torch.full((2, num_tokens), NO_EXPECTATION, dtype=torch.int64, pin_memory=pin_memory)
    tokens, positions = host.numpy()
    start = 0
    sources = prompt_sources or [req.origin_input_ids for req in reqs]
    for req, source, prefix_len, count in zip(reqs, sources, prefix_lens, extend_lens):
        # the row's tokens k in [0, max(count, 0)) sit at start + k; as in the kernel, only
        # indices inside [0, num_tokens) count (a row of SGLang's with a negative length shifts
        # the rows after it, since its start offsets are the running sum of the lengths)
        first_k = max(0, -start)
        end_k = min(max(count, 0), num_tokens - start)
        if end_k > first_k:
            lo, hi = start + first_k, start + end_k
            written = np.arange(prefix_len + first_k, prefix_len + end_k, dtype=np.int64)
            positions[lo:hi] = written
            prompt_k = min(max(len(req.origin_input_ids) - prefix_len, first_k), end_k)
            if prompt_k > first_k:
                tokens[lo : start + prompt_k] = source[prefix_len + first_k : prefix_len + prompt_k]
            if prompt_k < end_k:
                tokens[start + prompt_k : hi] = oracle.host_tokens(
                    generalized_req_id=generalized_req_id(
                        rid=req.rid, bootstrap_room=req.bootstrap_room
                    ),
                    positions=written[prompt_k - first_k :],
                )
        start += count
    return host


def expectations_built_on_host(forward_batch: ForwardBatch) -> bool:
    """Whether ``forward_batch``'s expectations come from :func:`extend_expectations_on_host`
    (an EXTEND / MIXED batch; a decode batch that DP-attention padding turned into EXTEND after
    ``init_new`` keeps its original mode's, computed in the forward)."""
    mode = getattr(forward_batch, "_original_forward_mode", None) or forward_batch.forward_mode
    return mode in _EXTEND_MODES


def write_input_assert_applies(forward_batch: ForwardBatch) -> bool:
    """False for EAGLE draft-decode forwards, True for every other forward."""
    spec_info = forward_batch.spec_info
    is_draft_decode = (
        forward_batch.forward_mode == ForwardMode.DECODE
        and spec_info is not None
        and spec_info.is_draft_input()
    )
    return not is_draft_decode


class WriteExpectations:
    """The write-input assert's expectations of one model runner.

    Args:
        oracle: the token oracle's manager.
        capacity: tokens of the preallocated expectations (at least the largest captured
            forward: see :func:`~..runner.memory_budget.max_tokens_per_forward`).
        device: the runner's device.
    """

    def __init__(
        self, *, oracle: TokenOracleManager, capacity: int, device: torch.device
    ) -> None:
        self._oracle = oracle
        self._device = device
        with torch.inference_mode(False):
            self._expected = ExpectedInputs.allocate(capacity=capacity, device=device)
        self._overflow: ExpectedInputs | None = None

    @property
    def capacity(self) -> int:
        return self._expected.capacity

    @property
    def device_bytes(self) -> int:
        """Bytes of the preallocated expectations (an overflow buffer is eager-only)."""
        return 2 * self._expected.capacity * self._expected.tokens.element_size()

    def compute(
        self, *, forward_batch: ForwardBatch, extend_expectations: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 ``[num_tokens]`` expected tokens and positions of ``forward_batch``.

        Args:
            extend_expectations: int64 ``[2, num_tokens]`` device tensor of
                :func:`extend_expectations_on_host` (EXTEND / MIXED batches: returned as they are;
                other batches: ignored).
        Raises:
            MissingRequestIdsError: the batch carries no request ids.
            RuntimeError: a captured forward has more tokens than the preallocated capacity, or
                an EXTEND / MIXED batch carries no expectations, or not one per token.
        """
        num_tokens = forward_batch.input_ids.shape[0]
        if expectations_built_on_host(forward_batch):
            if extend_expectations is None:
                raise RuntimeError(
                    "KV canary write-input assert: this EXTEND/MIXED ForwardBatch carries no "
                    "expectations"
                )
            if extend_expectations.shape[1] != num_tokens:
                raise RuntimeError(
                    f"KV canary write-input assert: this EXTEND/MIXED ForwardBatch has {num_tokens} "
                    f"tokens but its expectations cover {extend_expectations.shape[1]}"
                )
            return extend_expectations[0], extend_expectations[1]
        expected = self._buffer_for(num_tokens)
        self._oracle.fill_expected_inputs(forward_batch=forward_batch, expected_inputs_out=expected)
        return expected.tokens[:num_tokens], expected.positions[:num_tokens]

    def _buffer_for(self, num_tokens: int) -> ExpectedInputs:
        """The preallocated expectations, or (eager forwards only) a larger overflow buffer.
        The preallocated buffer is never replaced: captured graphs keep its address."""
        if num_tokens <= self._expected.capacity:
            return self._expected
        if capturing(self._device):
            raise RuntimeError(
                f"KV canary write-input assert: a captured forward has {num_tokens} tokens but "
                f"the preallocated expectations hold {self._expected.capacity}"
            )
        if self._overflow is None or self._overflow.capacity < num_tokens:
            capacity = 1 << (num_tokens - 1).bit_length()
            self._overflow = ExpectedInputs.allocate(capacity=capacity, device=self._device)
        return self._overflow
