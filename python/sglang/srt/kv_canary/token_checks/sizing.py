"""Sizes of the token checks' device buffers, known before the KV pool is sized.

The memory of the token history must come out of the KV budget at
``ModelRunnerKVCacheMixin._profile_available_bytes``, before ``req_to_token`` exists, so its rows
and columns are bounded from the same inputs SGLang 0.5.12.post1 uses to size ``req_to_token``
(``_resolve_max_num_reqs`` and ``_init_pools``).
"""

from __future__ import annotations

from typing import Any

from sglang.srt.kv_canary.req_to_expected_token_ids_manager import ReqToVerifyExpectedTokens

# ModelRunnerKVCacheMixin._resolve_max_num_reqs never lets max_running_requests exceed this.
SGLANG_MAX_REQUEST_ROWS = 4096
# ModelRunnerKVCacheMixin._init_pools: req_to_token has context_len + 4 (+ draft tokens) columns.
SGLANG_EXTRA_CONTEXT_COLUMNS = 4
_EXPECTED_INPUT_BYTES_PER_TOKEN = 16  # int64 token + int64 position


def request_rows_bound(server_args: Any, *, dp_size: int) -> int:
    """Upper bound of ``req_to_token``'s rows (its padding row 0 included)."""
    requested = server_args.max_running_requests
    rows = SGLANG_MAX_REQUEST_ROWS
    if requested is not None:
        rows = min(rows, max(requested // dp_size, 1))
    return rows + 1


def context_columns(server_args: Any, *, context_len: int) -> int:
    """``req_to_token``'s columns."""
    draft_tokens = server_args.speculative_num_draft_tokens or 0
    return context_len + SGLANG_EXTRA_CONTEXT_COLUMNS + draft_tokens


def max_tokens_per_forward(server_args: Any, *, max_running_requests: int | None) -> int:
    """Tokens the preallocated write-input expectations hold: every decode graph (one token per
    row, at most ``cuda_graph_max_bs`` / ``max_running_requests`` rows) and an ordinary prefill
    chunk. A larger eager forward (an unchunked long prompt) gets a larger buffer on demand."""
    candidates = (
        server_args.max_prefill_tokens,
        server_args.chunked_prefill_size,
        server_args.cuda_graph_max_bs,
        max_running_requests,
    )
    return max((c for c in candidates if isinstance(c, int) and c > 0), default=1)


def token_check_bytes(*, rows: int, columns: int, expected_tokens: int) -> int:
    """Device bytes of the token history (pool, row lengths, staging) and the expectations."""
    history = ReqToVerifyExpectedTokens.device_bytes(num_rows=rows, max_context_len=columns)
    return history + expected_tokens * _EXPECTED_INPUT_BYTES_PER_TOKEN


def token_check_bytes_bound(model_runner: Any) -> int:
    """:func:`token_check_bytes` for the largest pools SGLang may build for ``model_runner``
    (read at ``_profile_available_bytes``: ``server_args``, ``dp_size``, ``model_config``)."""
    server_args = model_runner.server_args
    return token_check_bytes(
        rows=request_rows_bound(server_args, dp_size=model_runner.dp_size),
        columns=context_columns(server_args, context_len=model_runner.model_config.context_len),
        expected_tokens=max_tokens_per_forward(
            server_args, max_running_requests=server_args.max_running_requests
        ),
    )
