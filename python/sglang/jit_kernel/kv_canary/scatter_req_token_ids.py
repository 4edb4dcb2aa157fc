"""Scatter flat per-request token histories into the expected-token pool (Triton + torch).

The verify-token check compares each verified slot's stored token with ``pool[row, position]``
where ``pool`` is int32 ``[req_pool_rows, max_context_len]`` (one row per ``req_to_token``
row). The host snapshots the token histories of a batch into one flat int64 array; this kernel
puts them in place.

Contract (both functions; ``bs = req_pool_indices.shape[0]``, ``T = flat_in.shape[0]``,
``R, L = pool_out.shape``):

- ``flat_in``: int64 ``[T]``, the tokens of every row back to back;
- ``offsets``: int64 ``[bs + 1]``, row ``b`` owns ``flat_in[offsets[b]:offsets[b + 1]]``
  (``0 = offsets[0] <= ... <= offsets[bs] = T``; rows may be empty);
- ``req_pool_indices``: int64 ``[bs]``, the pool row of each batch row;
- ``pool_out``: int32 ``[R, L]`` (any strides), written in place;
- ``history_lens`` (optional): int64 ``[bs]``. Without it each row's segment is the start of
  its history: token ``t`` of row ``b`` lands at
  ``pool_out[req_pool_indices[b], t - offsets[b]]``. With it, each segment is the *tail* of a
  history of ``history_lens[b]`` tokens (incremental updates): it lands at positions
  ``[history_lens[b] - n_b, history_lens[b])`` with ``n_b = offsets[b + 1] - offsets[b]``.
- ``history_lens_out`` (optional): int64 ``[R]``; ``history_lens_out[req_pool_indices[b]]`` is
  set to the row's history length (``history_lens[b]``, or ``n_b`` without ``history_lens``),
  so a verifier can bound its check per pool row.

Positions ``>= L`` are dropped (so are negative ones, which only malformed ``history_lens``
produce). An empty batch is a no-op. Shapes raise ``ValueError``, dtypes ``TypeError``, and
tensors on different devices ``ValueError``; every message names the argument and what was
expected. Tensor *values* (monotone offsets, row indices ``< R``) are not checked, because that
would need a host sync; the Triton kernel masks out-of-range rows and positions so malformed
values never write out of bounds, while the torch reference raises on them.

The plain-torch twin is :func:`.scatter_req_token_ids_ref.scatter_req_token_ids_torch_reference`
(same keyword signature and contract).

Launch: one program per ``BLOCK`` tokens of ``flat_in`` (plus enough programs to cover ``bs``
rows for ``history_lens_out``); tokens find their rows by searching ``offsets`` (see the
kernel). So the grid depends only on ``T`` and ``bs``, the work is balanced however lengths are
distributed, and there is no cap on the batch size. The launch never syncs with the host; it is
meant to run outside CUDA graphs (its grid follows ``T``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.direct_launch import DirectLauncher, ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import check_scatter_inputs
from sglang.jit_kernel.kv_canary.launch_config import interpreted, require_cuda_or_interpreter
from sglang.jit_kernel.kv_canary.triton_helpers import sum_1d

# Tokens (and rows, for history_lens_out) per program. On an H200, among {256..2048} x {2, 4, 8}
# warps, 512 x 4 is within 10% of the best at 2M tokens in long or short rows (16.9 us for
# 256 x 8192 tokens) and takes 3.8 us for a 256-row decode step (best: 2.7 us, at 256 x 8,
# which is 1.5x slower at 2M tokens); one configuration keeps serving free of mid-run compiles.
BLOCK = 512
NUM_WARPS = 4


# Whether *this* module is interpreted is decided when it is imported (``_INTERPRETED``); the
# reduction goes through triton_helpers.sum_1d, which works whether triton was first imported
# compiled or interpreted.


@triton.jit
def _block_ary_search_step(offsets_ptr, lo, hi, target, BLOCK: tl.constexpr):
    """Narrow ``[lo, hi]`` (scalars; ``offsets[lo] <= target``) around the last row ``b`` with
    ``offsets[b] <= target``: probe BLOCK evenly spaced rows at once, keep the gap after the
    last probe at or before ``target``. Shrinks the interval by a factor of BLOCK."""
    stride = (hi - lo + BLOCK) // BLOCK
    probe = lo + tl.arange(0, BLOCK) * stride
    in_range = probe <= hi
    probe_start = tl.load(offsets_ptr + probe, mask=in_range, other=0)
    at_or_before = sum_1d((in_range & (probe_start <= target)).to(tl.int64))
    new_lo = lo + (tl.maximum(at_or_before, 1) - 1) * stride
    return new_lo, tl.minimum(new_lo + stride - 1, hi)


# The sizes change every call, and the four inputs are views into one packed upload at offsets
# that change with the batch: specializing on their values or alignment would recompile while
# serving (a stall of a compile's length at unpredictable forwards). No parameter is specialized
# on its value at all, so the variant depends on argument types only and the launches go
# through a DirectLauncher (the step's eager path; see direct_launch.py).
@triton.jit(
    do_not_specialize=["flat_in_ptr", "offsets_ptr", "req_pool_indices_ptr", "history_lens_ptr",
                       "history_lens_out_ptr", "pool_out_ptr", "num_tokens", "batch_size",
                       "num_pool_rows", "max_context_len", "pool_row_stride", "pool_col_stride"],
)
def _scatter_req_token_ids_kernel(
    flat_in_ptr,
    offsets_ptr,
    req_pool_indices_ptr,
    history_lens_ptr,
    history_lens_out_ptr,
    pool_out_ptr,
    num_tokens,
    batch_size,
    num_pool_rows,
    max_context_len,
    pool_row_stride,
    pool_col_stride,
    HAS_HISTORY_LENS: tl.constexpr,
    HAS_HISTORY_LENS_OUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    first = tl.program_id(0).to(tl.int64) * BLOCK
    index = first + tl.arange(0, BLOCK)

    # ---- tokens: this program's BLOCK tokens of flat_in
    is_token = index < num_tokens
    token = tl.load(flat_in_ptr + index, mask=is_token, other=0)
    # Row of token t = the last b with offsets[b] <= t (an empty row shares its offset with its
    # successor and gets no token). Every dependent load costs latency, so: find the rows of the
    # tile's first and last token together by BLOCK-ary search (one step up to BLOCK rows, two
    # up to BLOCK**2), then binary-search each token only among the rows the tile spans (no
    # step at all when the tile lies inside one row).
    last = tl.minimum(first + BLOCK, tl.maximum(num_tokens, 1)) - 1
    first_lo = first * 0
    first_hi = first_lo + (batch_size - 1)
    last_lo = first_lo
    last_hi = first_hi
    while (first_lo < first_hi) | (last_lo < last_hi):
        first_lo, first_hi = _block_ary_search_step(offsets_ptr, first_lo, first_hi, first, BLOCK)
        last_lo, last_hi = _block_ary_search_step(offsets_ptr, last_lo, last_hi, last, BLOCK)
    lo = tl.full([BLOCK], 0, tl.int64) + first_lo
    hi = tl.full([BLOCK], 0, tl.int64) + last_lo
    span = last_lo - first_lo
    while span > 0:  # ceil(log2(span + 1)) halvings of [lo, hi]
        mid = (lo + hi + 1) >> 1
        go_right = tl.load(offsets_ptr + mid, mask=is_token, other=0) <= index
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid - 1)
        span = span >> 1
    row = lo
    row_start = tl.load(offsets_ptr + row, mask=is_token, other=0)
    pool_row = tl.load(req_pool_indices_ptr + row, mask=is_token, other=0)
    position = index - row_start
    if HAS_HISTORY_LENS:
        row_end = tl.load(offsets_ptr + row + 1, mask=is_token, other=0)
        history_len = tl.load(history_lens_ptr + row, mask=is_token, other=0)
        position += history_len - (row_end - row_start)
    keep = (
        is_token
        & (position >= 0)
        & (position < max_context_len)
        & (pool_row >= 0)
        & (pool_row < num_pool_rows)
    )
    tl.store(
        pool_out_ptr + pool_row * pool_row_stride + position * pool_col_stride,
        token.to(tl.int32),
        mask=keep,
    )

    # ---- rows: this program's BLOCK batch rows publish their history length
    if HAS_HISTORY_LENS_OUT:
        is_row = index < batch_size
        row_pool_row = tl.load(req_pool_indices_ptr + index, mask=is_row, other=0)
        if HAS_HISTORY_LENS:
            row_len = tl.load(history_lens_ptr + index, mask=is_row, other=0)
        else:
            seg_start = tl.load(offsets_ptr + index, mask=is_row, other=0)
            seg_end = tl.load(offsets_ptr + index + 1, mask=is_row, other=0)
            row_len = seg_end - seg_start
        tl.store(
            history_lens_out_ptr + row_pool_row,
            row_len,
            mask=is_row & (row_pool_row >= 0) & (row_pool_row < num_pool_rows),
        )


def launch_scatter_req_token_ids_kernel(
    *,
    flat_in: torch.Tensor,
    offsets: torch.Tensor,
    req_pool_indices: torch.Tensor,
    pool_out: torch.Tensor,
    history_lens: torch.Tensor | None = None,
    history_lens_out: torch.Tensor | None = None,
) -> None:
    """Scatter ``flat_in`` into ``pool_out`` (Triton); see the module docstring for the contract.

    No host sync, no allocation; on the current stream of ``pool_out``'s device. Graph safety:
    capturable only for a fixed ``T`` (the grid follows it), so call it outside CUDA graphs.
    """
    batch_size, num_tokens = check_scatter_inputs(
        flat_in=flat_in,
        offsets=offsets,
        req_pool_indices=req_pool_indices,
        pool_out=pool_out,
        history_lens=history_lens,
        history_lens_out=history_lens_out,
    )
    require_cuda_or_interpreter(
        device=pool_out.device, kernel_interpreted=_INTERPRETED,
        who_needs="launch_scatter_req_token_ids_kernel needs",
        reference="scatter_req_token_ids_torch_reference (same contract)",
    )
    if batch_size == 0:
        return
    work_items = max(num_tokens, batch_size) if history_lens_out is not None else num_tokens
    if work_items == 0:
        return
    _LAUNCH(
        (ceil_div(work_items, BLOCK),),
        flat_in,
        offsets,
        req_pool_indices,
        history_lens if history_lens is not None else offsets,  # unused when absent
        history_lens_out if history_lens_out is not None else offsets,  # unused when absent
        pool_out,
        num_tokens,
        batch_size,
        pool_out.shape[0],
        pool_out.shape[1],
        pool_out.stride(0),
        pool_out.stride(1),
        history_lens is not None,  # HAS_HISTORY_LENS
        history_lens_out is not None,  # HAS_HISTORY_LENS_OUT
        BLOCK,
    )


_INTERPRETED = interpreted(_scatter_req_token_ids_kernel)
_LAUNCH = DirectLauncher(_scatter_req_token_ids_kernel, num_warps=NUM_WARPS)
