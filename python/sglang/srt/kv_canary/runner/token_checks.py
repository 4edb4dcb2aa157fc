"""The token checks of one canary: verify-token and the write-input assert.

:class:`TokenChecks` owns the device token history (:mod:`..token_history.history`) and the
write-input expectations (:mod:`..token_history.write_expectations`), and says, per forward,
what the pre and post launches compare tokens with:

* verify-token: every verified slot's stored token against the history;
* write-input assert: each written token's input and position against the expectations, which
  decode-like forwards compute inside the forward (captured into their graphs) and EXTEND /
  MIXED forwards build on the host once the model is enqueued (the post launch checks them).

Where the history's tokens come from: a new owner's whole history from the host (through the
row updates), and every sampled token from the device, right after ``ModelRunner.sample``
(:meth:`TokenChecks.on_sampled`) — unless the host sends each row's new tokens itself (EAGLE,
whose accepted tokens never pass the sampler; see :attr:`TokenChecks.appends_sampled`).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.kv_canary.batch.carrier import CanaryBatchInputs, carried_field
from sglang.srt.kv_canary.batch.forward_kind import ForwardKind, capturing
from sglang.srt.kv_canary.runner.request_rows import RowUpdates
from sglang.srt.kv_canary.token_history.history import TokenHistory
from sglang.srt.kv_canary.token_history.write_expectations import (
    WriteExpectations,
    expectations_built_on_host,
    extend_expectations_on_host,
    write_input_assert_applies,
)
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager

# the kinds whose sampled tokens ModelRunner.sample produces (the EAGLE kinds sample elsewhere)
_SAMPLED_KINDS = (ForwardKind.DECODE, ForwardKind.EXTEND)


class TokenChecks:
    """The history and expectations of one canary (see the module docstring).

    Args:
        history: the device token history.
        expectations: the write-input expectations, or None (assert off, or an EAGLE draft
            model, whose inputs are the next position's tokens or guesses).
        oracle: the oracle manager (the write-input assert's source of generated tokens).
        verify_token: compare every verified slot's token with the history.
        appends_sampled: append the sampler's tokens on the device (False: the host sends
            every row's new tokens).
        device: the canary's device.
    """

    def __init__(
        self,
        *,
        history: TokenHistory,
        expectations: WriteExpectations | None,
        oracle: TokenOracleManager | None,
        verify_token: bool,
        appends_sampled: bool,
        device: torch.device,
    ) -> None:
        self.history = history
        self.expectations = expectations
        self._oracle = oracle
        self._verify_token = verify_token
        self.appends_sampled = appends_sampled
        self._device = device
        self._serving = False

    @property
    def device_bytes(self) -> dict[str, int]:
        history = self.history
        return {
            "token_history": history.tokens.numel() * 4 + history.lens.numel() * 8,
            "write_expectations": 0 if self.expectations is None
            else self.expectations.device_bytes,
        }

    def on_serving_start(self) -> None:
        """Serving starts: the start-up forwards' expectations are over, the history's kernels
        are compiled now (not at the first request)."""
        self._serving = True
        self.history.warm_up()

    def view_fields(self, forward_batch: Any, *, inputs: CanaryBatchInputs | None
                    ) -> dict[str, Any]:
        """The token-check fields of the pre launch's batch view: the history, and the
        write-input expectations the forward computes on the device (an EXTEND / MIXED batch's
        are built on the host while the model runs: :meth:`post_expectations`)."""
        fields: dict[str, Any] = {
            "token_history": self.history.tokens,
            "token_history_lens": self.history.lens,
            "verify_token": self._verify_token,
        }
        if self.expectations is None or not write_input_assert_applies(forward_batch):
            return fields
        if expectations_built_on_host(forward_batch) or self._start_up_forward(inputs):
            return fields
        tokens, positions = self.expectations.compute(forward_batch=forward_batch)
        fields["expected_input_ids"] = tokens
        fields["expected_positions"] = positions
        return fields

    def post_expectations(
        self, forward_batch: Any, *, inputs: CanaryBatchInputs | None,
        admitted: RowUpdates | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """An eager EXTEND / MIXED forward's write-input expectations for its post launch, built
        on the host now that the model is enqueued (the prompt tokens of a row whose whole
        history ``admitted``, the deferred admissions just sent, read come from that array) and
        sent with one non-blocking copy; None when the post launch checks none."""
        if self.expectations is None or not expectations_built_on_host(forward_batch):
            return None
        if not write_input_assert_applies(forward_batch) or self._start_up_forward(inputs):
            return None
        reqs = carried_field(
            forward_batch, "extend_reqs", what="requests for the write-input assert's "
            "expectations of its EXTEND/MIXED forward",
        )
        read = dict(admitted.read_whole) if admitted is not None else {}
        pin = self._device.type == "cuda"
        host = extend_expectations_on_host(
            reqs=reqs,
            prefix_lens=forward_batch.extend_prefix_lens_cpu,
            extend_lens=forward_batch.extend_seq_lens_cpu,
            num_tokens=forward_batch.input_ids.shape[0],
            oracle=self._oracle.oracle,
            pin_memory=pin,
            prompt_sources=[read.get(req.req_pool_idx, req.origin_input_ids) for req in reqs]
            if read else None,
        )
        return self.expectations.compute(
            forward_batch=forward_batch,
            extend_expectations=host.to(self._device, non_blocking=pin),
        )

    def wants_extend_reqs(self, forward_batch: Any) -> bool:
        """Whether the carrier must keep the batch's requests for :meth:`post_expectations`."""
        return self.expectations is not None and expectations_built_on_host(forward_batch)

    def on_sampled(self, *, kind: ForwardKind | None, forward_batch: Any,
                   next_token_ids: torch.Tensor) -> None:
        """``ModelRunner.sample`` returned ``next_token_ids`` for ``forward_batch``: append each
        row's token at the position after the forward (one launch; nothing for forwards whose
        tokens are sent by the host)."""
        if not self.appends_sampled or kind not in _SAMPLED_KINDS:
            return
        req_pool_indices, seq_lens = forward_batch.req_pool_indices, forward_batch.seq_lens
        rows = min(next_token_ids.shape[0], req_pool_indices.shape[0])
        if rows == 0:
            return
        if not (req_pool_indices.shape[0] == seq_lens.shape[0] == next_token_ids.shape[0]):
            # (padded rows, DP attention: the rows every tensor has)
            req_pool_indices, seq_lens = req_pool_indices[:rows], seq_lens[:rows]
            next_token_ids = next_token_ids[:rows]
        self.history.append_sampled(req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                                    tokens=next_token_ids)

    def _start_up_forward(self, inputs: CanaryBatchInputs | None) -> bool:
        """One of SGLang's own start-up forwards (``ModelRunner._dummy_run`` for kernel
        autotuning), built without ``init_new``: no requests, no request ids, padding rows only;
        no write-input expectations exist for it."""
        return (inputs is None or inputs.rids_int is None) and not self._serving and not (
            capturing(self._device)
        )

    def describe(self) -> str:
        """The token-check part of the start-up line."""
        write_input = (
            f"on (oracle; {self.expectations.capacity} tokens preallocated)"
            if self.expectations is not None else "off"
        )
        source = "sampled tokens appended on the device" if self.appends_sampled \
            else "new tokens sent by the host"
        tokens = self.history.tokens
        return (
            f"token checks: verify_token {'on' if self._verify_token else 'off'}, "
            f"write_input_assert {write_input}, token history {tokens.shape[0]} rows x "
            f"{tokens.shape[1]} ({source})"
        )
