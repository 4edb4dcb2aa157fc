"""How much device memory the canary takes, and how it is taken out of the KV budget.

SGLang 0.5.12 sizes the KV pool as ``max_total_num_tokens = available_bytes // cell_size``
(``DefaultPoolConfigurator``). The canary's buffers are allocated right after the pool and are
budgeted in two parts, so KV + canary stays within ``--mem-fraction-static``:

* per token: the pool seam's record bytes per KV token are added to the KV cell size (the
  records scale with the pool); a hybrid sliding-window pool (``HybridSWAPoolConfigurator``,
  whose cell is per full-attention token) gets a record per full token plus the SWA sub-pool's
  owner bytes scaled by SGLang's SWA-to-full token ratio (:func:`~..pools.hybrid_swa_token_bytes`);
* fixed: everything else (:class:`FixedBuffers`) is subtracted from the profiled available
  bytes before the pool is sized. Its sizes depend on ``req_to_token``'s shape, which does not
  exist yet at that point, so they are bounded from the same inputs SGLang uses to size it
  (``ModelRunnerKVCacheMixin._resolve_max_num_reqs`` and ``_init_pools``); the buffers actually
  allocated never exceed the reservation (a test checks it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, RECORD_BYTES, RING_ROW_FIELDS
from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.pools import (
    extra_record_rows,
    hybrid_swa_token_bytes,
    record_bytes_per_kv_token,
)
from sglang.srt.kv_canary.runner.host_tier import HOST_RECORD_BYTES, host_record_bytes_per_token

logger = logging.getLogger(__name__)

_INT64_BYTES = 8
_INT32_BYTES = 4
# ModelRunnerKVCacheMixin._resolve_max_num_reqs never lets max_running_requests exceed this.
SGLANG_MAX_REQUEST_ROWS = 4096
# ModelRunnerKVCacheMixin._init_pools: req_to_token has context_len + 4 (+ draft tokens) columns.
SGLANG_EXTRA_CONTEXT_COLUMNS = 4
# Host-to-device staging of one forward's row updates, preallocated after the seq_lens mirror
# (one area); a forward that uploads more (an unusually long admitted history) allocates its own.
UPLOAD_STAGING_WORDS = 1 << 16


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedBuffers:
    """Every device buffer of one runner's canary except the per-slot records, in bytes."""

    padding_records: int  # the record rows beyond the pool's token capacity (its padding page)
    ring: int
    counters: int
    owner_chains: int  # int64 per req_to_token row (two per row with EAGLE)
    seq_lens_mirror: int  # int64 per batch row (the scheduler's seq_lens) and the live row
    # count, uploaded per forward
    upload_staging: int
    token_history: int  # int32 [rows, columns] + int64 [rows]; 0 with both token checks off
    write_expectations: int  # int64 token + position per token; 0 without the write-input assert
    graph_request_ids: int  # int64 rids + rooms, int32 next token per captured batch row; 0
    # without the oracle
    uniform_blocks: int  # EAGLE: int64 lengths + starts per row, two block sizes; else 0
    host_tier_page: int = 0  # the host tier's records of the host pool's extra page

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
    """Bytes per pool token (added to the KV cell size): the pool seam's record bytes."""
    return record_bytes_per_kv_token()


def host_tier_bytes_per_token(server_args: Any) -> int:
    """Bytes per device KV token the host tier's records take on the device (0 without
    ``--enable-hierarchical-cache``): SGLang sizes the host pool as ``--hicache-ratio`` host
    slots per device slot (its extra page is a fixed buffer)."""
    if not server_args.enable_hierarchical_cache:
        return 0
    return host_record_bytes_per_token(hicache_ratio=server_args.hicache_ratio)


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
    host_tier: bool = False,
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
        padding_records=extra_record_rows(page_size=page_size) * RECORD_BYTES,
        ring=ring_capacity * RING_ROW_FIELDS * _INT64_BYTES,
        counters=NUM_COUNTERS * _INT64_BYTES,
        # (EAGLE: the draft canary's draft decode steps keep scratch owner chains too)
        owner_chains=request_rows * _INT64_BYTES * (2 if speculative else 1),
        # (its head: the live row count)
        seq_lens_mirror=(1 + seq_lens_mirror_rows_for(request_rows=request_rows,
                                                      graph_max_bs=graph_max_bs)) * _INT64_BYTES,
        upload_staging=UPLOAD_STAGING_WORDS * _INT64_BYTES,
        token_history=history,
        write_expectations=2 * write_expectation_tokens * _INT64_BYTES,
        graph_request_ids=(graph_max_bs * (2 * _INT64_BYTES + _INT32_BYTES)
                           if graph_request_ids else 0),
        uniform_blocks=UNIFORM_BLOCK_SIZE_COUNT * 2 * _INT64_BYTES * uniform_block_rows(
            request_rows=request_rows, graph_max_bs=graph_max_bs
        ) if speculative else 0,
        host_tier_page=page_size * HOST_RECORD_BYTES if host_tier else 0,
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


class MemoryBudget:
    """The canary's memory of one model runner: what it reserves from the KV budget before the
    pool is sized, and the report of what it allocated (see the module docstring).

    Args:
        config: the active configuration.
        model_runner: SGLang's ``ModelRunner`` (read: ``server_args``, ``model_config``,
            ``dp_size``, ``max_running_requests``).
    """

    def __init__(self, *, config: CanaryConfig, model_runner: Any) -> None:
        self._config = config
        self._model_runner = model_runner

    def fixed_buffers(self, *, page_size: int) -> FixedBuffers:
        """Upper bounds of every device buffer but the records (before the pools exist)."""
        model_runner = self._model_runner
        server_args = model_runner.server_args
        config = self._config
        write_input = config.canary_enabled and config.enable_write_input_assert
        return fixed_buffers(
            page_size=page_size,
            ring_capacity=config.ring_capacity,
            request_rows=request_rows_bound(server_args, dp_size=model_runner.dp_size),
            context_columns=context_columns_bound(
                server_args, context_len=model_runner.model_config.context_len
            ),
            token_history=config.token_history_enabled,
            write_expectation_tokens=max_tokens_per_forward(
                server_args, max_running_requests=server_args.max_running_requests
            ) if write_input else 0,
            graph_max_bs=graph_max_bs_bound(server_args),
            graph_request_ids=config.enable_token_oracle,
            speculative=server_args.speculative_algorithm is not None,
            host_tier=server_args.enable_hierarchical_cache,
        )

    def reserve(self, available_bytes: int) -> int:
        """The profiled KV budget minus the canary's fixed buffers (logged: the KV pool is sized
        from what this returns, with the records' bytes added to each token's cell)."""
        model_runner = self._model_runner
        fixed = self.fixed_buffers(page_size=model_runner.page_size)
        reserved = fixed.total
        records = per_token_bytes()
        draft = ""
        if model_runner.server_args.speculative_algorithm is not None:
            # the EAGLE draft runner's canary: the same buffers but the write expectations, and a
            # record per slot of the draft pool (its pool is sized from this runner's budget)
            reserved += fixed.total - fixed.write_expectations
            records *= 2
            draft = " (target and EAGLE draft canaries)"
        per_token = f"{records} B per token added to the KV cell size for the records"
        host_tier = host_tier_bytes_per_token(model_runner.server_args)
        if host_tier:
            per_token += f" and {host_tier} B for the host tier's records"
        if getattr(model_runner.model_config, "is_hybrid_swa", False):
            hybrid = hybrid_swa_token_bytes(
                swa_full_tokens_ratio=model_runner.server_args.swa_full_tokens_ratio
            )
            per_token = (f"{hybrid:g} B per full-attention token added to the hybrid pool's "
                         "cell size for the records and the SWA owners")
        logger.info(
            f"KV canary memory budget: {available_bytes} B profiled for the KV pool, "
            f"{reserved} B reserved for the canary's fixed buffers, {per_token}{draft}"
        )
        return available_bytes - reserved

    def report(self, *, allocated: dict[str, int], page_size: int) -> None:
        """Log what was allocated (``allocated``: bytes per buffer, ``records`` among them), and
        warn when the fixed buffers exceed what :meth:`reserve` took from the KV budget."""
        reserved = self.fixed_buffers(page_size=page_size)
        fixed = sum(allocated.values()) - allocated["records"]
        logger.info(
            f"KV canary device memory: {sum(allocated.values())} B allocated = records "
            f"{allocated['records']} B ({RECORD_BYTES} B per slot, and a hybrid pool's window "
            "owners, taken from the KV cell size) + "
            f"fixed buffers {fixed} B (reserved {reserved.total} B: "
            + ", ".join(f"{name} {value}" for name, value in allocated.items()
                        if name != "records")
            + ")"
        )
        if fixed > reserved.total:
            logger.warning(
                f"KV canary: the fixed buffers ({fixed} B) exceed the {reserved.total} B reserved "
                "from the KV budget; the server may run out of memory under load"
            )
