"""Padded rows of a replayed decode CUDA graph must point at request row 0.

SGLang 0.5.12's ``DecodeInputBuffers.populate_from_forward_batch`` copies
``req_pool_indices[:raw_bs]`` and leaves rows ``[raw_bs, bs)`` of a padded replay with the
indices of an earlier replay: stale requests, whose ``req_to_token`` rows attention (and the
canary) would then read. Row 0 of ``req_to_token`` is all zeros and marks padding; the canary
skips rows that point at it. The EAGLE draft-extend graph runner (``replay``) leaves the same
stale rows; the canary applies this fix there too, before each replay.
"""

from __future__ import annotations

from typing import Any


def point_padded_rows_at_row_zero(*, buffers: Any, raw_bs: int, bs: int) -> None:
    """Zero ``buffers.req_pool_indices[raw_bs:bs]`` (before SGLang fills ``[:raw_bs]``); a
    replay without padded rows launches nothing."""
    if raw_bs < bs:
        buffers.req_pool_indices[raw_bs:bs].zero_()
