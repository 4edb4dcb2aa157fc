"""How much device memory the canary takes, and how it is taken out of the KV budget.

SGLang 0.5.12 sizes the KV pool as ``max_total_num_tokens = available_bytes // cell_size``
(``DefaultPoolConfigurator``). The canary's buffers are allocated right after the pool and are
budgeted in two parts, so KV + canary stays within ``--mem-fraction-static``:

* per token: :data:`RECORD_BYTES` is added to the KV cell size (the records scale with the pool);
* fixed: everything else (:class:`FixedBuffers`) is subtracted from the profiled available
  bytes before the pool is sized. Its sizes depend on ``req_to_token``'s shape, which does not
  exist yet at that point, so they are bounded from the same inputs SGLang uses to size it
  (``ModelRunnerKVCacheMixin._resolve_max_num_reqs`` and ``_init_pools``); the buffers actually
  allocated never exceed the reservation (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, RECORD_BYTES, RING_ROW_FIELDS
from sglang.srt.kv_canary.runner.request_rows import UPLOAD_HEADER_WORDS

_INT64_BYTES = 8
_INT32_BYTES = 4
# ModelRunnerKVCacheMixin._resolve_max_num_reqs never lets max_running_requests exceed this.
SGLANG_MAX_REQUEST_ROWS = 4096
# ModelRunnerKVCacheMixin._init_pools: req_to_token has context_len + 4 (+ draft tokens) columns.
SGLANG_EXTRA_CONTEXT_COLUMNS = 4
# Host-to-device staging of one forward's uploads, preallocated after the seq_lens mirror (one
# area); a forward that uploads more (an unusually long admitted history) allocates its own.
UPLOAD_STAGING_WORDS = 1 << 16


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedBuffers:
    """Every device buffer of one runner's canary except the per-slot records, in bytes."""

    padding_records: int  # the pool's page_size padding rows of records
    ring: int
    counters: int
    owner_chains: int  # int64 per req_to_token row (two per row with EAGLE)
    seq_lens_mirror: int  # int64 per batch row: the scheduler's seq_lens, uploaded per forward
    upload_staging: int
    token_history: int  # int32 [rows, columns] + int64 [rows]; 0 with both token checks off
    write_expectations: int  # int64 token + position per token; 0 without the write-input assert
    graph_request_ids: int  # int64 rids + rooms, int32 next token per captured batch row; 0
    # without the oracle
    uniform_blocks: int  # EAGLE: int64 lengths + starts per row, two block sizes; else 0

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in self.__slots__)

    def describe(self) -> str:
        parts = ", ".join(
            f"{name.replace('_', ' ')} {getattr(self, name) / 2**20:.2f} MiB"
            for name in self.__slots__ if getattr(self, name)
        )
        return f"{self.total / 2**20:.2f} MiB ({parts})"


def per_token_bytes() -> int:
    """Bytes per pool token (added to the KV cell size)."""
    return RECORD_BYTES


def fixed_buffers(
    *,
    page_size: int,
    ring_capacity: int,
    request_rows: int,
    context_columns: int,
    token_history: bool,
    write_expectation_tokens: int,
    graph_max_bs: int,
    graph_request_ids: bool,
    speculative: bool = False,
) -> FixedBuffers:
    """The fixed buffers for these sizes (``write_expectation_tokens`` 0 without the
    write-input assert; ``graph_request_ids`` with the oracle's graph-resident ids;
    ``speculative`` with EAGLE's uniform blocks)."""
    history = (
        request_rows * context_columns * _INT32_BYTES + request_rows * _INT64_BYTES
        if token_history
        else 0
    )
    return FixedBuffers(
        padding_records=page_size * RECORD_BYTES,
        ring=ring_capacity * RING_ROW_FIELDS * _INT64_BYTES,
        counters=NUM_COUNTERS * _INT64_BYTES,
        # (EAGLE: the draft canary's draft decode steps keep scratch owner chains too)
        owner_chains=request_rows * _INT64_BYTES * (2 if speculative else 1),
        seq_lens_mirror=seq_lens_mirror_rows_for(request_rows=request_rows,
                                                 graph_max_bs=graph_max_bs) * _INT64_BYTES,
        upload_staging=(UPLOAD_HEADER_WORDS + UPLOAD_STAGING_WORDS) * _INT64_BYTES,
        token_history=history,
        write_expectations=2 * write_expectation_tokens * _INT64_BYTES,
        graph_request_ids=(graph_max_bs * (2 * _INT64_BYTES + _INT32_BYTES)
                           if graph_request_ids else 0),
        uniform_blocks=UNIFORM_BLOCK_SIZE_COUNT * 2 * _INT64_BYTES * uniform_block_rows(
            request_rows=request_rows, graph_max_bs=graph_max_bs
        ) if speculative else 0,
    )


# EAGLE's uniform-block sizes: 1 (draft decode steps) and speculative_num_draft_tokens (target
# verify, draft extend).
UNIFORM_BLOCK_SIZE_COUNT = 2


def uniform_block_rows(*, request_rows: int, graph_max_bs: int) -> int:
    """Rows preallocated per uniform block size (any batch, as the seq_lens mirror)."""
    return max(request_rows, graph_max_bs)


def request_rows_bound(server_args: Any, *, dp_size: int) -> int:
    """Upper bound of ``req_to_token``'s rows (its padding row 0 included)."""
    requested = server_args.max_running_requests
    rows = SGLANG_MAX_REQUEST_ROWS
    if requested is not None:
        rows = min(rows, max(requested // dp_size, 1))
    return rows + 1


def context_columns_bound(server_args: Any, *, context_len: int) -> int:
    """``req_to_token``'s columns."""
    draft_tokens = server_args.speculative_num_draft_tokens or 0
    return context_len + SGLANG_EXTRA_CONTEXT_COLUMNS + draft_tokens


def max_tokens_per_forward(server_args: Any, *, max_running_requests: int | None) -> int:
    """Tokens the preallocated write-input expectations hold: every decode graph (one token per
    row, or ``speculative_num_draft_tokens`` with EAGLE, at most ``cuda_graph_max_bs`` /
    ``max_running_requests`` rows) and an ordinary prefill chunk. A larger eager forward (an
    unchunked long prompt) gets a larger buffer on demand."""
    per_row = server_args.speculative_num_draft_tokens or 1
    rows = (server_args.cuda_graph_max_bs, max_running_requests)
    candidates = (
        server_args.max_prefill_tokens,
        server_args.chunked_prefill_size,
        *(r * per_row for r in rows if isinstance(r, int)),
    )
    return max((c for c in candidates if isinstance(c, int) and c > 0), default=1)


def seq_lens_mirror_rows_for(*, request_rows: int, graph_max_bs: int) -> int:
    """Rows of the seq_lens mirror: any batch (a batch has at most one row per request row; a
    replayed graph at most its capture size)."""
    return max(request_rows, graph_max_bs)


def seq_lens_mirror_rows(server_args: Any, *, request_rows: int) -> int:
    """:func:`seq_lens_mirror_rows_for` of a server."""
    return seq_lens_mirror_rows_for(request_rows=request_rows,
                                    graph_max_bs=graph_max_bs_bound(server_args))


def graph_max_bs_bound(server_args: Any) -> int:
    """The largest batch a decode CUDA graph is captured for (0 without graphs)."""
    return server_args.cuda_graph_max_bs or 0
