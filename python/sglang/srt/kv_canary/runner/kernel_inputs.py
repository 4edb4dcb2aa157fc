"""From SGLang's ``ForwardBatch`` to the kernels' :class:`CanaryBatchView` (views, never copies).

Graph-safe: only host-known shapes are used (tensor sizes and Python slices), so a view built
from the capture-time ``ForwardBatch`` of a CUDA graph points at the graph's static buffers and
every replay reads the live values.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout, CanaryBatchView
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

_LAYOUTS: dict[ForwardMode, BatchLayout | None] = {
    ForwardMode.DECODE: BatchLayout.DECODE,
    ForwardMode.EXTEND: BatchLayout.EXTEND,  # prefill, chunked prefill
    ForwardMode.MIXED: BatchLayout.EXTEND,  # chunked prefill + decode rows (prefix = seq_len - 1)
    ForwardMode.IDLE: None,  # no request rows (DP attention): nothing to verify or write
}


class UnsupportedForwardModeError(RuntimeError):
    """A forward mode the canary does not check reached the model; it is never skipped."""


def canary_layout(forward_mode: ForwardMode) -> BatchLayout | None:
    """The kernel layout of ``forward_mode``; None for IDLE (nothing to check).

    Raises:
        UnsupportedForwardModeError: any other mode (speculative, split prefill, dLLM, ...).
    """
    try:
        return _LAYOUTS[forward_mode]
    except KeyError:
        supported = ", ".join(mode.name for mode in _LAYOUTS)
        raise UnsupportedForwardModeError(
            f"KV canary: forward mode {forward_mode.name} is not supported (supported: "
            f"{supported}); refusing to run it unchecked. Unset SGLANG_KV_CANARY_MODE to serve "
            "this configuration without the canary."
        ) from None


def build_batch_view(
    forward_batch: ForwardBatch,
    *,
    layout: BatchLayout,
    checks: dict[str, Any],
    host_seq_lens: torch.Tensor | None,
) -> CanaryBatchView:
    """The canary's view of one non-IDLE forward.

    ``checks`` are the token-check fields (token history, write-input expectations).
    ``host_seq_lens`` is the persistent device buffer the scheduler's ``seq_lens_cpu`` is
    uploaded into before every forward (its first rows are the view's; None: no seq_lens
    invariant). A persistent buffer, so a captured graph's view reads each replay's values.

    Rows with ``req_pool_indices == 0`` (CUDA-graph or DP-attention padding) are skipped by the
    kernels. For EXTEND-family batches the row count is taken from ``extend_prefix_lens``: DP
    attention pads ``req_pool_indices``/``seq_lens``/``extend_seq_lens`` but not the prefix
    lengths or start offsets, and the padded rows carry no tokens.
    """
    if layout is BatchLayout.DECODE:
        rows = forward_batch.req_pool_indices.shape[0]
        return CanaryBatchView(
            layout=layout,
            req_pool_indices=forward_batch.req_pool_indices,
            seq_lens=forward_batch.seq_lens,
            extend_prefix_lens=None,
            extend_seq_lens=None,
            extend_start_loc=None,
            input_ids=forward_batch.input_ids,
            positions=forward_batch.positions,
            out_cache_loc=forward_batch.out_cache_loc,
            host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
            **checks,
        )
    rows = forward_batch.extend_prefix_lens.shape[0]
    return CanaryBatchView(
        layout=layout,
        req_pool_indices=forward_batch.req_pool_indices[:rows],
        seq_lens=forward_batch.seq_lens[:rows],
        extend_prefix_lens=forward_batch.extend_prefix_lens,
        extend_seq_lens=forward_batch.extend_seq_lens[:rows],
        extend_start_loc=forward_batch.extend_start_loc,
        input_ids=forward_batch.input_ids,
        positions=forward_batch.positions,
        out_cache_loc=forward_batch.out_cache_loc,
        host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
        **checks,
    )
