"""The token checks of one model runner: history snapshot, history refresh, per-forward inputs.

One :class:`TokenChecks` per model runner, used at three points of every forward:

1. :meth:`~TokenChecks.snapshot` (``ForwardBatch.init_new`` hook, host): the requests' token
   histories, only what the pool lacks (one pinned buffer); with the write-input assert, for an
   EXTEND / MIXED batch, also each row's prompt length (one small host-to-device copy);
2. :meth:`~TokenChecks.populate_history` (``CanaryRuntime.run_step``, host, outside graphs):
   copy and scatter the snapshot into the persistent history pool, on the forward's stream,
   before the eager forward or the graph replay reads it;
3. :meth:`~TokenChecks.view_fields` (inside the forward, so inside captured CUDA graphs): the
   token-check fields of the kernels' ``CanaryBatchView``:

   * the history pool and its per-pool-row lengths (the kernels index them with the batch's
     ``req_pool_indices``: a captured graph needs nothing else to check tokens on replay);
   * ``verify_token``;
   * with the write-input assert, the expected input token and position of every token, in a
     preallocated :class:`ExpectedInputs`: the oracle's token for decode rows (from the
     graph-resident request ids inside a captured graph) and for every *generated* token of an
     extend row (position >= the request's prompt length: the decode rows of a MIXED batch, the
     outputs of a retracted request prefilled again), ``-1`` for prompt tokens, which the write
     kernel then compares with the history instead.

Graph safety of (3): no host sync and no persistent allocation inside a capture (temporaries
come from the graph's pool). The only allocation after start-up is the one-off growth of an
overflow buffer for an eager forward larger than any seen before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sglang.srt.kv_canary.req_to_expected_token_ids_manager import (
    ReqToVerifyExpectedTokens,
    RequestHistory,
    attach_req_all_ids_info,
    populate_req_to_expected_token_ids,
)
from sglang.srt.kv_canary.request_ids import RIDS_INT_ATTR, generalized_req_ids_of
from sglang.srt.kv_canary.token_oracle.oracle_manager import ExpectedInputs, TokenOracleManager
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

# Attribute of an EXTEND / MIXED ForwardBatch: int64 [rows] prompt length of each row's request.
PROMPT_LENS_ATTR = "kv_canary_prompt_lens"


def write_input_assert_applies(forward_batch: ForwardBatch) -> bool:
    """False for EAGLE draft-decode forwards: a draft model's input tokens are draft tokens (not
    oracle tokens) and its slot ``p`` holds the token of position ``p + 1`` (not the history's
    token at ``p``), so neither expectation holds there. True for every other forward."""
    spec_info = forward_batch.spec_info
    is_draft_decode = (
        forward_batch.forward_mode == ForwardMode.DECODE
        and spec_info is not None
        and spec_info.is_draft_input()
    )
    return not is_draft_decode


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class TokenChecks:
    """Verify-token and the write-input assert of one model runner.

    Args:
        history: the runner's token history (maintained whenever a token check is on).
        verify_token: compare every verified slot's token with the history.
        oracle: the token oracle's manager when the write-input assert is on, else None.
        expected_capacity: tokens of the preallocated expectations (at least the largest
            captured forward: see :func:`~.sizing.max_tokens_per_forward`).
    """

    def __init__(
        self,
        *,
        history: ReqToVerifyExpectedTokens,
        verify_token: bool,
        oracle: TokenOracleManager | None,
        expected_capacity: int,
    ) -> None:
        self.history = history
        self.verify_token = verify_token
        self._oracle = oracle
        self._device = history.tokens.device
        self._expected = (
            ExpectedInputs.allocate(capacity=expected_capacity, device=self._device)
            if oracle is not None
            else None
        )
        self._overflow: ExpectedInputs | None = None  # eager forwards above the capacity
        self._serving = False

    @property
    def write_input_assert(self) -> bool:
        return self._oracle is not None

    @property
    def expected_capacity(self) -> int:
        return 0 if self._expected is None else self._expected.capacity

    # ------------------------------------------------------------------ host, per forward

    def snapshot(self, *, forward_batch: ForwardBatch, reqs: Sequence[RequestHistory]) -> None:
        """At ``ForwardBatch.init_new``: attach the history snapshot (and, write-input assert on,
        an EXTEND / MIXED batch's prompt lengths) to ``forward_batch``. Never syncs."""
        attach_req_all_ids_info(
            forward_batch=forward_batch, reqs=reqs, req_to_verify_expected_tokens=self.history
        )
        if self._oracle is not None and forward_batch.forward_mode in (
            ForwardMode.EXTEND,
            ForwardMode.MIXED,
        ):
            pin = self._device.type == "cuda"
            prompt_lens = torch.tensor(
                [len(req.origin_input_ids) for req in reqs], dtype=torch.int64, pin_memory=pin
            )
            setattr(
                forward_batch, PROMPT_LENS_ATTR, prompt_lens.to(self._device, non_blocking=pin)
            )

    def populate_history(self, forward_batch: ForwardBatch) -> None:
        """Before the forward (``run_step``): copy and scatter the batch's snapshot into the
        history pool, on the current stream, outside any graph.

        Raises:
            RuntimeError: the batch carries no snapshot (its ``init_new`` hook did not run).
        """
        populate_req_to_expected_token_ids(
            forward_batch=forward_batch, req_to_verify_expected_tokens=self.history
        )

    def start_serving(self) -> None:
        """Start-up is over (warm-up runs and graph capture done): from now on every forward
        must carry request ids when the write-input assert is on."""
        self._serving = True

    # ------------------------------------------------------------------ inside the forward

    def view_fields(self, forward_batch: ForwardBatch) -> dict[str, Any]:
        """Keyword fields of ``CanaryBatchView`` for ``forward_batch`` (a non-IDLE batch).

        Raises:
            MissingRequestIdsError: write-input assert on, and a serving or captured forward
                carries no request ids (the oracle's ``ForwardBatch.init_new`` hook did not run
                for it).
            RuntimeError: a captured forward has more tokens than the preallocated capacity, or
                a serving EXTEND / MIXED batch carries no prompt lengths.
        """
        fields: dict[str, Any] = {
            "expected_token_pool": self.history.tokens,
            "expected_token_valid_lens": self.history.valid_lens_by_row,
            "verify_token": self.verify_token,
        }
        if self._oracle is None or not write_input_assert_applies(forward_batch):
            return fields
        if (
            not self._serving
            and not _capturing(self._device)
            and getattr(forward_batch, RIDS_INT_ATTR, None) is None
        ):
            # SGLang's own start-up forwards (ModelRunner._dummy_run for kernel autotuning)
            # are built without init_new: no request ids, padding rows only.
            return fields
        num_tokens = forward_batch.input_ids.shape[0]
        expected = self._expected_inputs_for(num_tokens)
        self._oracle.fill_expected_inputs(
            forward_batch=forward_batch, expected_inputs_out=expected
        )
        tokens = expected.tokens[:num_tokens]
        positions = expected.positions[:num_tokens]
        if forward_batch.forward_mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
            self._predict_generated_tokens(
                forward_batch=forward_batch, tokens=tokens, positions=positions
            )
        fields["expected_input_ids"] = tokens
        fields["expected_positions"] = positions
        return fields

    def _predict_generated_tokens(
        self, *, forward_batch: ForwardBatch, tokens: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Set the oracle's token for every token of an extend row at a position past its
        request's prompt (an output token: the oracle emitted it). Eager batches only (EXTEND /
        MIXED are never captured); fixed shapes, no host sync."""
        prompt_lens = getattr(forward_batch, PROMPT_LENS_ATTR, None)
        if prompt_lens is None:
            raise RuntimeError(
                "KV canary write-input assert: this EXTEND/MIXED ForwardBatch carries no prompt "
                f"lengths ('{PROMPT_LENS_ATTR}'); the ForwardBatch.init_new hook of the token "
                "checks did not run for it"
            )
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

    def _expected_inputs_for(self, num_tokens: int) -> ExpectedInputs:
        """The preallocated expectations, or (eager forwards only) a larger overflow buffer.

        The preallocated buffer is never replaced: captured graphs keep its address.
        """
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
