"""Plain-torch reference of :mod:`.scatter_req_token_ids` (same keyword signature and
contract, stated in that module's docstring); tests compare the two exactly."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import check_scatter_inputs


def scatter_req_token_ids_torch_reference(
    *,
    flat_in: torch.Tensor,
    offsets: torch.Tensor,
    req_pool_indices: torch.Tensor,
    pool_out: torch.Tensor,
    history_lens: torch.Tensor | None = None,
    history_lens_out: torch.Tensor | None = None,
) -> None:
    """Plain-torch twin of :func:`.scatter_req_token_ids.launch_scatter_req_token_ids_kernel`.

    For tests and CPU self-checks: it reads tensor values on the host (syncs) and raises
    ``RuntimeError``/``IndexError`` on malformed values where the kernel would mask them.
    """
    batch_size, num_tokens = check_scatter_inputs(
        flat_in=flat_in,
        offsets=offsets,
        req_pool_indices=req_pool_indices,
        pool_out=pool_out,
        history_lens=history_lens,
        history_lens_out=history_lens_out,
    )
    if batch_size == 0:
        return
    counts = offsets[1:] - offsets[:-1]
    if int(offsets[0]) != 0 or int(offsets[-1]) != num_tokens or bool((counts < 0).any()):
        raise RuntimeError(
            f"offsets must rise monotonically from 0 to flat_in.shape[0]={num_tokens}; got "
            f"offsets[0]={int(offsets[0])}, offsets[-1]={int(offsets[-1])}, "
            f"min step {int(counts.min())}"
        )
    lens = history_lens if history_lens is not None else counts
    if history_lens_out is not None:
        history_lens_out[req_pool_indices] = lens
    rows = torch.repeat_interleave(torch.arange(batch_size, device=flat_in.device), counts)
    token_index = torch.arange(num_tokens, dtype=torch.int64, device=flat_in.device)
    positions = token_index - offsets[rows] + (lens - counts)[rows]
    keep = (positions >= 0) & (positions < pool_out.shape[1])
    pool_out[req_pool_indices[rows][keep], positions[keep]] = flat_in[keep].to(torch.int32)
