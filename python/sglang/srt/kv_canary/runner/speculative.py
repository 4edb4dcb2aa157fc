"""Everything the canary does for EAGLE (spec v2, topk 1), in one component.

The target model's canary checks its prefills and TARGET_VERIFY forwards; the draft model's
runner has its own canary on the draft pool (draft prefill, the draft decode steps,
DRAFT_EXTEND_V2), whose token history is the request's tokens from index 1 (draft slot ``p``
holds the K/V of the token at ``p + 1``). A verification writes a block of tokens per row and
keeps the first ``accept_lens``; both canaries then set each row's owner chain after its last
kept token (:mod:`sglang.jit_kernel.kv_canary.accepted_owner`). The draft decode steps' tokens
are guesses the next draft extend replaces, so they advance scratch owner chains, zeroed before
every draft pass. EAGLE's accepted tokens do not pass through ``ModelRunner.sample``: its
canaries receive their rows' new tokens from the host (``RequestRows(history_tails=True)``).

:class:`UniformBlocks` holds the persistent per-row lengths and starts of the uniform-block
views (block 1 for draft decode steps, ``speculative_num_draft_tokens`` for target verify and
draft extend).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.batch.forward_kind import ForwardKind, capturing, speculative_block
from sglang.srt.kv_canary.runner.graph_padding import point_padded_rows_at_row_zero
from sglang.srt.kv_canary.runner.graph_request_ids import GraphRequestIds
from sglang.srt.kv_canary.runner.launch_accounting import LaunchAccounting
from sglang.srt.kv_canary.token_oracle.eagle_verify import sample_verify_with_oracle
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager

_T = TypeVar("_T")


class UniformBlocks:
    """Persistent int64 ``extend_seq_lens`` / ``extend_start_loc`` of uniform-block forwards:
    ``block`` tokens per row, row ``b`` starting at token ``b * block``.

    Args:
        rows: rows preallocated per block size (the largest captured batch and more).
        blocks: the block sizes to preallocate (1 for draft decode steps, ``D``).
        device: where the buffers live.
    Graph safety: captured views point at the preallocated buffers; a larger eager batch grows
    them (a capture never allocates here: it raises instead).
    """

    def __init__(self, *, rows: int, blocks: tuple[int, ...], device: torch.device) -> None:
        self._device = device
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for block in blocks:
            self._buffers[block] = self._allocate(rows=rows, block=block)

    @property
    def device_bytes(self) -> int:
        return sum(2 * lengths.numel() * 8 for lengths, _ in self._buffers.values())

    def _allocate(self, *, rows: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode(False):
            lengths = torch.full((rows,), block, dtype=torch.int64, device=self._device)
            starts = torch.arange(rows, dtype=torch.int64, device=self._device) * block
        return lengths, starts

    def views(self, *, rows: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(extend_seq_lens, extend_start_loc)``, int64 ``[rows]`` views.

        Raises:
            RuntimeError: a CUDA-graph capture needs more rows (or a block) than preallocated.
        """
        buffers = self._buffers.get(block)
        if buffers is None or buffers[0].shape[0] < rows:
            if capturing(self._device):
                raise RuntimeError(
                    f"KV canary: a captured forward needs {rows} rows of block {block}, more "
                    "than the preallocated uniform blocks"
                )
            buffers = self._allocate(rows=1 << max(rows - 1, 0).bit_length(), block=block)
            self._buffers[block] = buffers
        lengths, starts = buffers
        return lengths[:rows], starts[:rows]


class SpeculativeCanary:
    """The EAGLE part of one model runner's canary (see the module docstring).

    Args:
        state: the canary's device state.
        accounting: the canary's launch accounting (draft captures count into it).
        accepted_owner_resync: the launch that sets owner chains after a verification
            (``(*, state, req_pool_indices, out_cache_loc, accept_lens, block)``).
        block_rows: rows preallocated per uniform block size.
        draft_tokens: ``speculative_num_draft_tokens``.
        is_draft: this canary is the draft model runner's.
        reinject_padded_row_bug: leave the draft-extend graph's padded rows stale (re-inject
            SGLang 0.5.12's bug so the canary can be seen catching it).
    """

    def __init__(
        self,
        *,
        state: CanaryDeviceState,
        accounting: LaunchAccounting,
        accepted_owner_resync: Callable[..., None],
        block_rows: int,
        draft_tokens: int,
        is_draft: bool,
        reinject_padded_row_bug: bool,
    ) -> None:
        self._state = state
        self._accounting = accounting
        self._resync = accepted_owner_resync
        self._reinject_padded_row_bug = reinject_padded_row_bug
        self.is_draft = is_draft
        self.blocks = UniformBlocks(rows=block_rows, blocks=(1, draft_tokens),
                                    device=state.device)
        self._draft_decode_state: CanaryDeviceState | None = None
        if is_draft:
            with torch.inference_mode(False):
                self._draft_decode_state = dataclasses.replace(
                    state, owner_chains=torch.zeros_like(state.owner_chains)
                )
        self.in_draft_capture = False  # an EAGLE draft graph's warm-up / capture runs

    @property
    def device_bytes(self) -> dict[str, int]:
        """Bytes of the uniform blocks and the draft decode steps' scratch owner chains."""
        scratch = self._draft_decode_state
        return {
            "uniform_blocks": self.blocks.device_bytes,
            "owner_chains": 0 if scratch is None else scratch.owner_chains.numel() * 8,
        }

    def state_for(self, kind: ForwardKind | None) -> CanaryDeviceState:
        """The device state a forward of ``kind`` checks (draft decode steps advance scratch
        owner chains)."""
        if kind is ForwardKind.DRAFT_DECODE and self._draft_decode_state is not None:
            return self._draft_decode_state
        return self._state

    def on_serving_start(self) -> None:
        if self._draft_decode_state is not None:
            self._draft_decode_state.owner_chains.zero_()

    def on_draft_pass_start(self) -> None:
        """A draft pass starts: its steps' owner chains start unknown (each step's pre launch
        adopts the record's chain, the next step checks it)."""
        if self._draft_decode_state is not None:
            self._draft_decode_state.owner_chains.zero_()

    def on_tokens_accepted(
        self, *, req_pool_indices: torch.Tensor, out_cache_loc: torch.Tensor,
        accept_lens: torch.Tensor, block: int,
    ) -> None:
        """A verification kept ``accept_lens[b]`` of the ``block`` tokens row ``b`` wrote at
        ``out_cache_loc``: set each row's owner chain after its kept tokens (device only)."""
        if req_pool_indices.shape[0] == 0:
            return
        self._resync(
            state=self._state, req_pool_indices=req_pool_indices, out_cache_loc=out_cache_loc,
            accept_lens=accept_lens, block=block,
        )

    def draft_extend_done(self, forward_batch: Any, *, accept_lens: torch.Tensor) -> None:
        """A DRAFT_EXTEND_V2 forward was enqueued: keep the accepted tokens' owner chains."""
        rows = forward_batch.req_pool_indices.shape[0]
        if rows == 0:
            return
        self.on_tokens_accepted(
            req_pool_indices=forward_batch.req_pool_indices,
            out_cache_loc=forward_batch.out_cache_loc,
            accept_lens=accept_lens[:rows],
            block=speculative_block(forward_batch),
        )

    def capture_draft_graph(
        self, *, graph_runner: Any, capture: Callable[[], _T], graph_ids: GraphRequestIds | None
    ) -> _T:
        """Capture one EAGLE draft graph (the draft decode steps): with the graph-resident
        request ids attached (:func:`capture_with_draft_ids`); the launches captured into it are
        counted (every replay enqueues them), and the ``ModelRunner.forward`` calls of the
        warm-up and capture runs pass the canary's host work by (they run start-up rows only:
        :attr:`in_draft_capture`)."""
        self.in_draft_capture = True
        try:
            return capture_with_draft_ids(
                graph_runner=graph_runner, graph_ids=graph_ids,
                capture=lambda: self._accounting.capture_same_per_size(
                    graph_runner=graph_runner, capture=capture
                ),
            )
        finally:
            self.in_draft_capture = False

    def prepare_draft_extend_replay(self, *, graph_runner: Any, forward_batch: Any) -> torch.Tensor:
        """Before a draft-extend graph's replay: point its padded rows at pool row 0 (unless the
        padded-row bug is re-injected: SGLang 0.5.12 leaves stale rows there), and return the
        accepted lengths (read before the replay: a padded replay points ``spec_info`` at its
        padded buffers)."""
        if not self._reinject_padded_row_bug:
            buffers = graph_runner.buffers
            point_padded_rows_at_row_zero(
                buffers=buffers, raw_bs=forward_batch.batch_size,
                bs=buffers.req_pool_indices.shape[0],
            )
        return forward_batch.spec_info.num_accept_tokens

    def sample_verify(
        self, *, oracle: TokenOracleManager | None, batch: Any, logits_output: Any,
        verify_input: Any, sample: Callable[[], _T],
    ) -> _T:
        """EAGLE v2 verification (:func:`verify_sample`); the owner chains then follow the
        accepted tokens (``sample`` returns ``(predict, accept_lens, accept_index)``)."""
        result = verify_sample(oracle=oracle, batch=batch, logits_output=logits_output,
                               verify_input=verify_input, sample=sample)
        if not batch.forward_mode.is_idle():
            self.on_tokens_accepted(
                req_pool_indices=batch.req_pool_indices, out_cache_loc=batch.out_cache_loc,
                accept_lens=result[1], block=verify_input.draft_token_num,
            )
        return result


def capture_with_draft_ids(
    *, graph_runner: Any, graph_ids: GraphRequestIds | None, capture: Callable[[], _T]
) -> _T:
    """Run one capture of an EAGLE draft graph runner with the graph-resident request ids
    attached (oracle on: ``graph_ids``). Its captured function calls
    ``eagle_worker.draft_forward`` (not the forward it is given), so that method is shadowed on
    the worker instance for the duration of the capture."""
    if graph_ids is None:
        return capture()
    worker = graph_runner.eagle_worker
    draft_forward = worker.draft_forward
    missing = object()
    shadowed = vars(worker).get("draft_forward", missing)
    buffers = graph_ids.buffers_for(graph_runner)

    def draft_forward_with_request_ids(forward_batch: Any) -> Any:
        graph_ids.attach_capture_ids(forward_batch=forward_batch, buffers=buffers)
        return draft_forward(forward_batch)

    worker.draft_forward = draft_forward_with_request_ids
    try:
        return capture()
    finally:
        if shadowed is missing:
            del worker.draft_forward
        else:
            worker.draft_forward = shadowed


def verify_sample(
    *, oracle: TokenOracleManager | None, batch: Any, logits_output: Any, verify_input: Any,
    sample: Callable[[], _T],
) -> _T:
    """EAGLE v2 verification's sampling: with the oracle it picks the oracle's tokens (see
    :mod:`..token_oracle.eagle_verify`), else SGLang's own ``sample``."""
    if oracle is None:
        return sample()
    return sample_verify_with_oracle(
        manager=oracle,
        batch=batch,
        logits_output=logits_output,
        draft_token_num=verify_input.draft_token_num,
        verify_positions=verify_input.positions,
        sample=sample,
    )
