"""Plain-torch reference of :mod:`.append_history` (same keyword signature and contract, stated
in that module's docstring); tests compare the two exactly."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import check_append_history_inputs


def launch_append_history_tokens(
    *,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    tokens: torch.Tensor,
    pool_out: torch.Tensor,
    history_lens_out: torch.Tensor,
) -> None:
    """Reference of :func:`.append_history.launch_append_history_tokens`."""
    check_append_history_inputs(
        req_pool_indices=req_pool_indices, seq_lens=seq_lens, tokens=tokens,
        pool_out=pool_out, history_lens_out=history_lens_out,
    )
    rows = req_pool_indices.to(torch.int64)
    positions = seq_lens.to(torch.int64)
    num_rows, columns = pool_out.shape
    row_ok = (rows > 0) & (rows < num_rows)
    known = torch.full_like(positions, -1)
    known[row_ok] = history_lens_out[rows[row_ok]]
    append = row_ok & (known == positions) & (positions >= 0) & (positions < columns)
    pool_out[rows[append], positions[append]] = tokens[append].to(torch.int32)
    history_lens_out[rows[append]] = positions[append] + 1


def bind_append_history_tokens(
    *, pool_out: torch.Tensor, history_lens_out: torch.Tensor
) -> Callable[..., None]:
    """Reference of :func:`.append_history.bind_append_history_tokens`."""
    empty = torch.zeros((0,), dtype=torch.int64, device=pool_out.device)
    check_append_history_inputs(req_pool_indices=empty, seq_lens=empty, tokens=empty,
                                pool_out=pool_out, history_lens_out=history_lens_out)

    def append(*, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
               tokens: torch.Tensor) -> None:
        launch_append_history_tokens(req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                                     tokens=tokens, pool_out=pool_out,
                                     history_lens_out=history_lens_out)

    return append
