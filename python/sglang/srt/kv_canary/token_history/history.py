"""The token history on the device: what each request row's token must be at each position.

A persistent device pool shaped like ``req_to_token``:

- ``tokens``: int32 ``[req_pool_rows, max_context_len]``; ``tokens[r, p]`` is the token at
  position ``p`` of the request that owns ``req_to_token`` row ``r``;
- ``lens``: int64 ``[req_pool_rows]``; positions ``>= lens[r]`` of row ``r`` are not known yet
  (the kernels skip them). Row 0, the padding row of CUDA-graph batches, stays empty.

Two writers, both one launch on the current stream and never a host sync:

- :meth:`TokenHistory.scatter`: histories the host sends (a new owner's whole
  ``origin_input_ids + output_ids``, or, for EAGLE, a row's new tokens), with
  :mod:`sglang.jit_kernel.kv_canary.scatter_req_token_ids`;
- :meth:`TokenHistory.append_sampled`: the tokens ``ModelRunner.sample`` just produced, each at
  the position after its row's forward, with :mod:`sglang.jit_kernel.kv_canary.append_history`
  (only where the row's known history ends exactly there).

Both tensors have fixed addresses, so a forward replayed from a CUDA graph reads the values as
they are at the replay: the graph's kernels index them with the graph's own
``req_pool_indices``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# launch_scatter_req_token_ids_kernel / bind_append_history_tokens, or their torch references
# (same keyword contracts).
LaunchFn = Callable[..., None]
BindFn = Callable[..., LaunchFn]


class TokenHistory:
    """The device token history of one ``req_to_token`` pool.

    Args:
        num_rows: rows of ``req_to_token`` (padding row 0 included).
        max_context_len: columns of ``req_to_token``.
        device: the device of ``req_to_token``.
        scatter: the scatter launch (the Triton kernel, or its torch reference on a CPU).
        bind_append: binds the sampled-token append to this history (likewise).
    """

    def __init__(
        self, *, num_rows: int, max_context_len: int, device: torch.device | str,
        scatter: LaunchFn, bind_append: BindFn,
    ) -> None:
        if num_rows < 1 or max_context_len < 1:
            raise ValueError(
                f"num_rows and max_context_len must be >= 1, got {num_rows} and {max_context_len}"
            )
        self._scatter = scatter
        with torch.inference_mode(False):  # updated in place while serving
            self.tokens = torch.zeros(
                (num_rows, max_context_len), dtype=torch.int32, device=device
            )
            self.lens = torch.zeros((num_rows,), dtype=torch.int64, device=device)
        self._append = bind_append(pool_out=self.tokens, history_lens_out=self.lens)

    @staticmethod
    def device_bytes(*, num_rows: int, max_context_len: int) -> int:
        """Device memory of the pool and its row lengths."""
        return num_rows * max_context_len * 4 + num_rows * 8

    def scatter(
        self, *, req_pool_indices: torch.Tensor, lens: torch.Tensor, offsets: torch.Tensor,
        tokens: torch.Tensor,
    ) -> None:
        """Set row ``req_pool_indices[k]``'s known length to ``lens[k]`` and its last tokens to
        ``tokens[offsets[k]:offsets[k + 1]]`` (device tensors; one launch, none for no rows)."""
        if req_pool_indices.shape[0] == 0:
            return
        self._scatter(
            flat_in=tokens, offsets=offsets, req_pool_indices=req_pool_indices,
            pool_out=self.tokens, history_lens=lens, history_lens_out=self.lens,
        )

    def warm_up(self) -> None:
        """Launch both writers once on padding row 0 alone (they change nothing there), so the
        first served request does not wait for their kernels to compile."""
        device = self.tokens.device
        row = torch.zeros((1,), dtype=torch.int64, device=device)
        self._scatter(flat_in=row[:0], offsets=torch.zeros((2,), dtype=torch.int64, device=device),
                      req_pool_indices=row, pool_out=self.tokens,
                      history_lens=torch.zeros((1,), dtype=torch.int64, device=device),
                      history_lens_out=self.lens)
        self._append(req_pool_indices=row, seq_lens=row, tokens=row)

    def append_sampled(
        self, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor
    ) -> None:
        """Append ``tokens[b]`` at position ``seq_lens[b]`` of row ``req_pool_indices[b]`` where
        that row's known history ends there (one launch, none for no rows)."""
        if tokens.shape[0] == 0:
            return
        self._append(req_pool_indices=req_pool_indices, seq_lens=seq_lens, tokens=tokens)
