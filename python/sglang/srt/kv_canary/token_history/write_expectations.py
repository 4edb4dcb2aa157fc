"""What the write-input assert expects each written token and position to be.

Computed inside the forward (so inside captured CUDA graphs) into a preallocated
:class:`~sglang.srt.kv_canary.token_oracle.manager.ExpectedInputs`:

* decode rows: the oracle's token at the row's position (from the graph-resident request ids
  inside a captured graph);
* extend rows: the oracle's token for every *generated* token (position >= the request's
  prompt length: the decode rows of a MIXED batch, the outputs of a retracted request prefilled
  again); for prompt tokens the request's own token, sent with the batch from its
  ``origin_input_ids`` (so extend rows are checked against the request, not against
  themselves, also in a request's first forward, before its token history reaches the device).

Off for EAGLE draft-decode forwards (their inputs are draft tokens, and draft slot ``p`` holds
the token of position ``p + 1``).

Graph safety: no host sync and no persistent allocation inside a capture (temporaries come from
the graph's pool). The only allocation after start-up is the one-off growth of an overflow buffer
for an eager forward larger than any seen before.
"""

from __future__ import annotations

import torch

from sglang.srt.kv_canary.token_oracle.manager import ExpectedInputs, TokenOracleManager
from sglang.srt.kv_canary.token_oracle.request_ids import generalized_req_ids_of
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

_EXTEND_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)


def write_input_assert_applies(forward_batch: ForwardBatch) -> bool:
    """False for EAGLE draft-decode forwards, True for every other forward."""
    spec_info = forward_batch.spec_info
    is_draft_decode = (
        forward_batch.forward_mode == ForwardMode.DECODE
        and spec_info is not None
        and spec_info.is_draft_input()
    )
    return not is_draft_decode


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


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
        self, *, forward_batch: ForwardBatch, prompt_lens: torch.Tensor | None,
        prompt_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 ``[num_tokens]`` expected tokens and positions of ``forward_batch``.

        Args:
            prompt_lens: int64 ``[rows]`` prompt length of each row (EXTEND / MIXED batches).
            prompt_tokens: int64 ``[num_tokens]`` the request's token at each prompt position,
                -1 elsewhere (EXTEND / MIXED batches; None: prompt tokens get no expectation
                here and the write kernel compares them with the token history).
        Raises:
            MissingRequestIdsError: the batch carries no request ids.
            RuntimeError: a captured forward has more tokens than the preallocated capacity, or
                an EXTEND / MIXED batch carries no prompt lengths.
        """
        num_tokens = forward_batch.input_ids.shape[0]
        expected = self._buffer_for(num_tokens)
        self._oracle.fill_expected_inputs(forward_batch=forward_batch, expected_inputs_out=expected)
        tokens = expected.tokens[:num_tokens]
        positions = expected.positions[:num_tokens]
        if forward_batch.forward_mode in _EXTEND_MODES:
            if prompt_lens is None:
                raise RuntimeError(
                    "KV canary write-input assert: this EXTEND/MIXED ForwardBatch carries no "
                    "prompt lengths; the ForwardBatch.init_new hook did not run for it"
                )
            if prompt_tokens is not None:
                tokens.copy_(prompt_tokens[:num_tokens])
            self._predict_generated_tokens(
                forward_batch=forward_batch, prompt_lens=prompt_lens, tokens=tokens,
                positions=positions,
            )
        return tokens, positions

    def _predict_generated_tokens(
        self, *, forward_batch: ForwardBatch, prompt_lens: torch.Tensor, tokens: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """The oracle's token for every token of an extend row at a position past its request's
        prompt. Eager batches only (EXTEND / MIXED are never captured); no host sync."""
        rows = prompt_lens.shape[0]
        if rows == 0:
            return
        lengths = forward_batch.extend_seq_lens[:rows].to(torch.int64)
        ends = torch.cumsum(lengths, dim=0)
        token_index = torch.arange(tokens.shape[0], dtype=torch.int64, device=tokens.device)
        owner = torch.searchsorted(ends, token_index, right=True)
        in_rows = owner < rows
        owner = owner.clamp(max=rows - 1)
        ids = generalized_req_ids_of(forward_batch)[:rows][owner]
        generated = in_rows & (positions >= prompt_lens[owner])
        predicted = self._oracle.oracle.expected_tokens(
            generalized_req_ids=ids, positions=positions
        )
        tokens.copy_(torch.where(generated, predicted.to(torch.int64), tokens))

    def _buffer_for(self, num_tokens: int) -> ExpectedInputs:
        """The preallocated expectations, or (eager forwards only) a larger overflow buffer.
        The preallocated buffer is never replaced: captured graphs keep its address."""
        if num_tokens <= self._expected.capacity:
            return self._expected
        if _capturing(self._device):
            raise RuntimeError(
                f"KV canary write-input assert: a captured forward has {num_tokens} tokens but "
                f"the preallocated expectations hold {self._expected.capacity}"
            )
        if self._overflow is None or self._overflow.capacity < num_tokens:
            capacity = 1 << (num_tokens - 1).bit_length()
            self._overflow = ExpectedInputs.allocate(capacity=capacity, device=self._device)
        return self._overflow
