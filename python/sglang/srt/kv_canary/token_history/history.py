"""The token history on the device: what each request row's token must be at each position.

The truth lives on the host, in each request's ``origin_input_ids + output_ids``; the kernels
read it from a persistent device pool shaped like ``req_to_token``:

- ``tokens``: int32 ``[req_pool_rows, max_context_len]``; ``tokens[r, p]`` is the token at
  position ``p`` of the request that owns ``req_to_token`` row ``r``;
- ``lens``: int64 ``[req_pool_rows]``; positions ``>= lens[r]`` of row ``r`` are not known yet
  (the kernels skip them). Row 0, the padding row of CUDA-graph batches, stays empty.

Both have fixed addresses, so a forward replayed from a CUDA graph reads the values refreshed
before the replay: the graph's kernels index them with the graph's own ``req_pool_indices``.
What to send is decided on the host by :class:`~..runner.request_rows.RequestRows` (only the
tokens the pool lacks); :meth:`TokenHistory.upload` scatters one forward's tokens with one
kernel launch, on the current stream, outside graphs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang.srt.kv_canary.runner.request_rows import TokenHistorySection

# launch_scatter_req_token_ids_kernel or its torch reference (same keyword contract).
ScatterFn = Callable[..., None]


class TokenHistory:
    """The device token history of one ``req_to_token`` pool.

    Args:
        num_rows: rows of ``req_to_token`` (padding row 0 included).
        max_context_len: columns of ``req_to_token``.
        device: the device of ``req_to_token``.
        scatter: the scatter implementation (the Triton kernel, or its torch reference on a CPU
            without the Triton interpreter).
    """

    def __init__(
        self, *, num_rows: int, max_context_len: int, device: torch.device | str,
        scatter: ScatterFn,
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

    @staticmethod
    def device_bytes(*, num_rows: int, max_context_len: int) -> int:
        """Device memory of the pool and its row lengths."""
        return num_rows * max_context_len * 4 + num_rows * 8

    def upload(self, section: TokenHistorySection) -> None:
        """Scatter one forward's tokens (a device-side section) into the pool and set each
        row's known length. One kernel launch; no host sync; outside graphs."""
        if section.req_pool_indices.shape[0] == 0:
            return
        self._scatter(
            flat_in=section.req_all_ids_flat,
            offsets=section.offsets,
            req_pool_indices=section.req_pool_indices,
            pool_out=self.tokens,
            history_lens=section.req_all_ids_lens,
            history_lens_out=self.lens,
        )
