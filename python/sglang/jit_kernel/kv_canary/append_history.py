"""Triton kernel that appends one token per row to the token history, from the runner's packed
upload: the token-history update of a decode step, capturable in the step's CUDA graph.

Most forwards are decode steps in which every row's known history grows by exactly one token.
The runner's packed upload (:mod:`sglang.srt.kv_canary.runner.request_rows`) of such a step
says so in its first word, and this launch, which reads the upload area at a fixed address,
applies it. Captured once into each graph, it takes the per-step scatter launch (its Triton
dispatch and input checks, tens of microseconds of host time a step) off the host.

Contract (``upload``: int64 ``[W]``, the device copy of a packed upload; ``R, L =
pool_out.shape``):

- ``n = upload[0]``: the number of rows to append (0 or less: nothing to do). For ``n > 0`` the
  words after it are the upload's sections for ``n`` rows: ``n`` words this launch skips (the
  seq_lens mirror), then ``rows = upload[1 + n : 1 + 2n]``, ``lens = upload[1 + 2n : 1 + 3n]``,
  ``n + 1`` offsets it skips, and ``tokens = upload[2 + 4n : 2 + 5n]``.
- For each ``b < min(n, max_rows)`` with ``0 <= rows[b] < R``:
  ``pool_out[rows[b], lens[b] - 1] = tokens[b]`` (int32) when ``0 <= lens[b] - 1 < L``, and
  ``history_lens_out[rows[b]] = lens[b]``: exactly what the scatter of
  :mod:`.scatter_req_token_ids` does with ``history_lens`` for one-token segments.
- ``n`` with ``2 + 5n > W`` (a layout that does not fit ``upload``) writes nothing.

``max_rows`` bounds the rows read: a graph's batch size when captured (a replay with fewer live
rows reads only ``n``), the upload's ``n`` when launched eagerly. ``pool_out`` int32 ``[R, L]``
(any strides), ``history_lens_out`` int64 ``[R]`` contiguous; all on one device.

Graph safety: the grid depends on ``max_rows`` only and ``n`` is read on the device, so one
captured launch serves every replay; no host sync, nothing allocated. No argument is
specialized on its value, so the launch goes through a :class:`.direct_launch.DirectLauncher`.
The plain-torch twin is :mod:`.append_history_ref` (same keyword signature, same results).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.direct_launch import DirectLauncher, ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import check_append_history_inputs
from sglang.jit_kernel.kv_canary.launch_config import interpreted, require_cuda_or_interpreter

BLOCK = 128  # rows per program
NUM_WARPS = 4


@triton.jit(
    do_not_specialize=["upload_ptr", "pool_out_ptr", "history_lens_out_ptr", "upload_words",
                       "max_rows", "num_pool_rows", "max_context_len", "pool_row_stride",
                       "pool_col_stride"],
)
def _append_history_tokens_kernel(
    upload_ptr,
    pool_out_ptr,
    history_lens_out_ptr,
    upload_words,
    max_rows,
    num_pool_rows,
    max_context_len,
    pool_row_stride,
    pool_col_stride,
    BLOCK: tl.constexpr,
):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    count = tl.load(upload_ptr)
    live = (index < count) & (index < max_rows) & (2 + 5 * count <= upload_words)
    row = tl.load(upload_ptr + 1 + count + index, mask=live, other=0)
    length = tl.load(upload_ptr + 1 + 2 * count + index, mask=live, other=0)
    token = tl.load(upload_ptr + 2 + 4 * count + index, mask=live, other=0)
    row_ok = live & (row >= 0) & (row < num_pool_rows)
    position = length - 1
    tl.store(
        pool_out_ptr + row * pool_row_stride + position * pool_col_stride,
        token.to(tl.int32),
        mask=row_ok & (position >= 0) & (position < max_context_len),
    )
    tl.store(history_lens_out_ptr + row, length, mask=row_ok)


def launch_append_history_tokens(
    *,
    upload: torch.Tensor,
    max_rows: int,
    pool_out: torch.Tensor,
    history_lens_out: torch.Tensor,
) -> None:
    """Append the upload's one token per row (Triton); contract in the module docstring.

    Raises:
        TypeError / ValueError: see :func:`.kernel_inputs.check_append_history_inputs`.
    """
    check_append_history_inputs(
        upload=upload, max_rows=max_rows, pool_out=pool_out, history_lens_out=history_lens_out
    )
    require_cuda_or_interpreter(
        device=pool_out.device, kernel_interpreted=_INTERPRETED,
        who_needs="launch_append_history_tokens needs",
        reference="append_history_ref (same contract)",
    )
    if max_rows == 0:
        return
    _LAUNCH(
        (ceil_div(max_rows, BLOCK),),
        upload,
        pool_out,
        history_lens_out,
        upload.shape[0],
        max_rows,
        pool_out.shape[0],
        pool_out.shape[1],
        pool_out.stride(0),
        pool_out.stride(1),
        BLOCK,
    )


_INTERPRETED = interpreted(_append_history_tokens_kernel)
_LAUNCH = DirectLauncher(_append_history_tokens_kernel, num_warps=NUM_WARPS)
