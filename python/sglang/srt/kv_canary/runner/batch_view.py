"""From SGLang's ``ForwardBatch`` to the kernels' :class:`CanaryBatchView` (views, never copies).

The view's layout and lengths follow the forward's :class:`~..batch.forward_kind.ForwardKind`
(its module docstring has the table). The EAGLE kinds take their per-row lengths and starts from
persistent uniform blocks (:class:`~.speculative.UniformBlocks`).

Graph safety: only host-known shapes are used (tensor sizes and Python slices), so a view built
from the capture-time ``ForwardBatch`` of a CUDA graph points at the graph's static buffers and
every replay reads the live values (``DRAFT_EXTEND``'s prefix is one captured subtraction, a
draft step's strided ``out_cache_loc`` one captured copy).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout, CanaryBatchView
from sglang.srt.kv_canary.batch.forward_kind import ForwardKind, speculative_block
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class BlockViews(Protocol):
    """Per-row lengths and starts of uniform-block forwards (:class:`~.speculative.UniformBlocks`)."""

    def views(self, *, rows: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(extend_seq_lens, extend_start_loc)``, int64 ``[rows]``."""


def build_batch_view(
    forward_batch: ForwardBatch,
    *,
    kind: ForwardKind,
    checks: dict[str, Any],
    host_seq_lens: torch.Tensor | None,
    live_rows: torch.Tensor | None = None,
    blocks: BlockViews | None = None,
) -> CanaryBatchView:
    """The canary's view of one non-IDLE forward of ``kind``.

    ``checks`` are the token-check fields (token history, write-input expectations).
    ``host_seq_lens`` is the persistent device buffer the scheduler's ``seq_lens_cpu`` is
    uploaded into before every forward (its first rows are the view's; None: no seq_lens
    invariant). ``live_rows`` is the persistent device word the batch's row count is uploaded
    into with it (None: every row of the view is the scheduler's). Persistent buffers, so a
    captured graph's view reads each replay's values. ``blocks`` supplies the speculative kinds' lengths and starts (required for them).

    Rows with ``req_pool_indices == 0`` (CUDA-graph or DP-attention padding) are skipped by the
    kernels; so are rows past ``live_rows`` (a replayed graph's padded rows, whatever request row
    they carry), which the pre launch reports when they carry one. For EXTEND batches the row count is taken from ``extend_prefix_lens``: DP
    attention pads ``req_pool_indices``/``seq_lens``/``extend_seq_lens`` but not the prefix
    lengths or start offsets, and the padded rows carry no tokens.

    Raises:
        ValueError: a speculative kind without ``blocks``, or with uneven rows.
    """
    common = dict(
        input_ids=forward_batch.input_ids,
        positions=forward_batch.positions,
        out_cache_loc=forward_batch.out_cache_loc,
        live_rows=live_rows,
        **checks,
    )
    if kind is ForwardKind.DECODE:
        rows = forward_batch.req_pool_indices.shape[0]
        return CanaryBatchView(
            layout=BatchLayout.DECODE,
            req_pool_indices=forward_batch.req_pool_indices,
            seq_lens=forward_batch.seq_lens,
            extend_prefix_lens=None,
            extend_seq_lens=None,
            extend_start_loc=None,
            host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
            **common,
        )
    if kind is ForwardKind.EXTEND:
        rows = forward_batch.extend_prefix_lens.shape[0]
        return CanaryBatchView(
            layout=BatchLayout.EXTEND,
            req_pool_indices=forward_batch.req_pool_indices[:rows],
            seq_lens=forward_batch.seq_lens[:rows],
            extend_prefix_lens=forward_batch.extend_prefix_lens,
            extend_seq_lens=forward_batch.extend_seq_lens[:rows],
            extend_start_loc=forward_batch.extend_start_loc,
            host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
            **common,
        )
    if blocks is None:
        raise ValueError(f"KV canary: a {kind.name} view needs the uniform blocks")
    rows = forward_batch.req_pool_indices.shape[0]
    seq_lens = forward_batch.seq_lens[:rows]
    if kind is ForwardKind.DRAFT_DECODE:
        block = 1
        prefix = forward_batch.positions[:rows]
        # a draft step's out_cache_loc is a strided row of the pass's [steps, rows] slots: one
        # captured copy (graph-pool memory inside a capture)
        common["out_cache_loc"] = forward_batch.out_cache_loc.contiguous()
    else:
        block = speculative_block(forward_batch)
        prefix = seq_lens if kind is ForwardKind.TARGET_VERIFY else seq_lens - block
    lengths, starts = blocks.views(rows=rows, block=block)
    return CanaryBatchView(
        layout=BatchLayout.EXTEND,
        req_pool_indices=forward_batch.req_pool_indices,
        seq_lens=seq_lens,
        extend_prefix_lens=prefix,
        extend_seq_lens=lengths,
        extend_start_loc=starts,
        host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
        **common,
    )
