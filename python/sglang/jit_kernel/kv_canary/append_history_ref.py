"""Plain-torch reference of :mod:`.append_history` (same keyword signature and contract, stated
in that module's docstring); tests compare the two exactly. Reads the row count on the host
(syncs): tests and CPU self-checks only."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import check_append_history_inputs


def launch_append_history_tokens(
    *,
    upload: torch.Tensor,
    max_rows: int,
    pool_out: torch.Tensor,
    history_lens_out: torch.Tensor,
) -> None:
    """Reference of :func:`.append_history.launch_append_history_tokens`."""
    check_append_history_inputs(
        upload=upload, max_rows=max_rows, pool_out=pool_out, history_lens_out=history_lens_out
    )
    count = int(upload[0])
    if count <= 0 or 2 + 5 * count > upload.shape[0]:
        return
    applied = min(count, max_rows)
    rows = upload[1 + count : 1 + count + applied]
    lens = upload[1 + 2 * count : 1 + 2 * count + applied]
    tokens = upload[2 + 4 * count : 2 + 4 * count + applied]
    row_ok = (rows >= 0) & (rows < pool_out.shape[0])
    history_lens_out[rows[row_ok]] = lens[row_ok]
    positions = lens - 1
    keep = row_ok & (positions >= 0) & (positions < pool_out.shape[1])
    pool_out[rows[keep], positions[keep]] = tokens[keep].to(torch.int32)
