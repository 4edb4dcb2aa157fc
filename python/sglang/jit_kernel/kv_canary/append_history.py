"""Triton kernel that appends each row's sampled token to the token history, on the device.

After ``ModelRunner.sample`` the runner hands the sampler's output here: the token a forward
sampled for batch row ``b`` is the request's token at position ``seq_lens[b]`` (the position
after the forward's last one), and it becomes part of the row's known history at once, with no
host work per row. The append is conditional, so the history never takes a token the scheduler
discards or a position it already knows: a chunked prefill's intermediate sample (its row already
knows the prompt beyond ``seq_lens[b]``) and a row whose history lags (a gap) are left alone.

Contract (``n = tokens.shape[0]``; ``R, L = pool_out.shape``):

- for each ``b < n`` with ``rp = req_pool_indices[b]``, ``0 < rp < R`` (row 0 is the padding
  row and never changes), ``s = seq_lens[b]``, ``0 <= s < L`` and ``history_lens_out[rp] == s``:
  ``pool_out[rp, s] = tokens[b]`` (int32) and ``history_lens_out[rp] = s + 1``;
- nothing else is written.

``req_pool_indices``, ``seq_lens`` and ``tokens``: int32 or int64 ``[n]``, contiguous;
``pool_out`` int32 ``[R, L]`` (any strides); ``history_lens_out`` int64 ``[R]``; all on one
device. A batch names each request row at most once (SGLang's batches do).

Graph safety: the grid depends on ``n`` only, no value is read on the host; no host sync,
nothing allocated. No argument is specialized on its value, so the launch goes through a
:class:`.direct_launch.DirectLauncher`; :func:`bind_append_history_tokens` binds the persistent
history once (the per-batch tensors are the launch's leading parameters). The plain-torch twin is :mod:`.append_history_ref` (same
keyword signature, same results).
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
    do_not_specialize=["req_pool_indices_ptr", "seq_lens_ptr", "tokens_ptr", "num_rows",
                       "pool_out_ptr", "history_lens_out_ptr", "num_pool_rows",
                       "max_context_len", "pool_row_stride", "pool_col_stride"],
)
def _append_history_tokens_kernel(
    # per launch
    req_pool_indices_ptr,
    seq_lens_ptr,
    tokens_ptr,
    num_rows,
    # fixed per history (the bound tail of bind_append_history_tokens)
    pool_out_ptr,
    history_lens_out_ptr,
    num_pool_rows,
    max_context_len,
    pool_row_stride,
    pool_col_stride,
    BLOCK: tl.constexpr,
):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = index < num_rows
    row = tl.load(req_pool_indices_ptr + index, mask=live, other=0).to(tl.int64)
    position = tl.load(seq_lens_ptr + index, mask=live, other=-1).to(tl.int64)
    token = tl.load(tokens_ptr + index, mask=live, other=0)
    row_ok = live & (row > 0) & (row < num_pool_rows)
    known = tl.load(history_lens_out_ptr + row, mask=row_ok, other=-1)
    append = row_ok & (known == position) & (position >= 0) & (position < max_context_len)
    tl.store(
        pool_out_ptr + row * pool_row_stride + position * pool_col_stride,
        token.to(tl.int32),
        mask=append,
    )
    tl.store(history_lens_out_ptr + row, position + 1, mask=append)


def launch_append_history_tokens(
    *,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    tokens: torch.Tensor,
    pool_out: torch.Tensor,
    history_lens_out: torch.Tensor,
) -> None:
    """Append each row's sampled token (Triton); contract in the module docstring.

    Raises:
        TypeError / ValueError: see :func:`.kernel_inputs.check_append_history_inputs`.
    """
    check_append_history_inputs(
        req_pool_indices=req_pool_indices, seq_lens=seq_lens, tokens=tokens,
        pool_out=pool_out, history_lens_out=history_lens_out,
    )
    bind_append_history_tokens(pool_out=pool_out, history_lens_out=history_lens_out)(
        req_pool_indices=req_pool_indices, seq_lens=seq_lens, tokens=tokens
    )


def bind_append_history_tokens(
    *, pool_out: torch.Tensor, history_lens_out: torch.Tensor
) -> AppendHistoryTokens:
    """The append into one persistent history, its tensors checked and bound once: each call
    takes the per-batch tensors only and checks only them (the runtime appends every sampled
    forward's tokens; the bound form keeps that launch's host work small).

    Raises:
        TypeError / ValueError: see :func:`.kernel_inputs.check_append_history_inputs`.
    """
    return AppendHistoryTokens(pool_out=pool_out, history_lens_out=history_lens_out)


class AppendHistoryTokens:
    """:func:`bind_append_history_tokens`: call with ``req_pool_indices``, ``seq_lens`` and
    ``tokens`` (the contract of the module docstring)."""

    def __init__(self, *, pool_out: torch.Tensor, history_lens_out: torch.Tensor) -> None:
        empty = torch.zeros((0,), dtype=torch.int64, device=pool_out.device)
        check_append_history_inputs(req_pool_indices=empty, seq_lens=empty, tokens=empty,
                                    pool_out=pool_out, history_lens_out=history_lens_out)
        require_cuda_or_interpreter(
            device=pool_out.device, kernel_interpreted=_INTERPRETED,
            who_needs="launch_append_history_tokens needs",
            reference="append_history_ref (same contract)",
        )
        self._pool_out = pool_out
        self._history_lens_out = history_lens_out
        self._device = pool_out.device
        self._launch = _LAUNCH.with_tail((
            pool_out, history_lens_out, pool_out.shape[0], pool_out.shape[1],
            pool_out.stride(0), pool_out.stride(1), BLOCK,
        ))

    def __call__(self, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 tokens: torch.Tensor) -> None:
        rows = tokens.shape[0]
        device = self._device
        if not all(
            tensor.dtype in _INDEX_DTYPES and tensor.dim() == 1 and tensor.shape[0] == rows
            and tensor.is_contiguous() and tensor.device == device
            for tensor in (req_pool_indices, seq_lens, tokens)
        ):
            check_append_history_inputs(  # raises, naming the argument
                req_pool_indices=req_pool_indices, seq_lens=seq_lens, tokens=tokens,
                pool_out=self._pool_out, history_lens_out=self._history_lens_out,
            )
        if rows == 0:
            return
        self._launch((ceil_div(rows, BLOCK),), req_pool_indices, seq_lens, tokens, rows)


_INDEX_DTYPES = (torch.int32, torch.int64)
_INTERPRETED = interpreted(_append_history_tokens_kernel)
_LAUNCH = DirectLauncher(_append_history_tokens_kernel, num_warps=NUM_WARPS)
