"""The report file's format: JSON lines, one object each, told apart by ``"type"``.

Written by :mod:`sglang.srt.kv_canary.monitor.report_file` (one scheduler process may hold two
canaries, an EAGLE target's and its draft's, and several processes may append to one file: every
object carries the writer's ``pid``, and ``pool`` is ``"draft"`` on the draft canary's objects and
absent otherwise). Each canary writes its header first, then, at each poll that handled new
violation indices, its objects of that poll in one ``write``.

=================  ==========================================================================
``header``         ``schema`` (:data:`SCHEMA_VERSION`), ``pid``, ``start_time`` (ISO 8601, UTC),
                   ``start_unix``, ``path``, ``tp_rank`` (None when unknown),
                   ``pool_description``, ``ring_capacity``, ``history_steps`` (the forwards
                   whose mode and batch size are kept), ``config`` (every setting)
``violation``      one violation row, the fields of its log line (``check``; ``reasons``: the
                   labels, ``reason_bits``: the integer; ``req_pool_idx``, ``slot``,
                   ``position``, ``stored_token``, ``expected_token``; ``stored_chain`` /
                   ``expected_chain`` as ``"0x"`` + 16 hex digits on verify rows,
                   ``input_position`` / ``expected_position`` on write rows, None otherwise;
                   ``step``) and ``rid``, ``forward_mode``, ``batch_size`` of the row's
                   request and forward (None when not known; sweep rows: always None),
                   ``repeat`` (True: log mode did not print it, the same corruption was
                   reported one step earlier), ``time`` (unix seconds when written)
``ring_overflow``  ``dropped`` rows lost this poll, ``dropped_total``, ``ring_capacity``,
                   ``first_index`` / ``end_index`` (the violation indices handled this poll),
                   ``host_step`` (the newest forward step recorded, None before any), ``time``
``abort``          abort mode: one request finished with the canary's error: ``rid``,
                   ``cause`` (``violation``, ``cache``: its cached prefix held an evicted node,
                   ``ring_overflow``, ``unknown_owner``: every live request), ``step``,
                   ``check``, ``reasons``, ``slot``, ``position`` of the first row naming it
                   (None for the other causes), ``tokens_delivered`` (output tokens sent before
                   the abort), ``time``
``cache_eviction`` abort mode: radix nodes made unmatchable at once: ``cause`` (``violation``,
                   ``ring_overflow``), ``nodes``, ``tokens``, ``locked_nodes`` (freed when their
                   aborted requests finish), ``slots`` (suspect slots reported, at most 64),
                   ``rids`` (requests whose cached prefix was cut), ``time``
=================  ==========================================================================

A reader of :data:`SCHEMA_VERSION` may rely on every key listed in :data:`REQUIRED_KEYS`.
"""

from __future__ import annotations

from collections.abc import Mapping

SCHEMA_VERSION = 1
TYPE_KEY = "type"
HEADER = "header"
VIOLATION = "violation"
RING_OVERFLOW = "ring_overflow"
ABORT = "abort"
CACHE_EVICTION = "cache_eviction"
POOL_KEY = "pool"  # present, "draft", on an EAGLE draft canary's objects only

HEADER_KEYS: tuple[str, ...] = (
    TYPE_KEY, "schema", "pid", "start_time", "start_unix", "path", "tp_rank",
    "pool_description", "ring_capacity", "history_steps", "config",
)
VIOLATION_KEYS: tuple[str, ...] = (
    TYPE_KEY, "pid", "time", "step", "check", "reasons", "reason_bits", "req_pool_idx", "rid",
    "slot", "position", "stored_token", "expected_token", "stored_chain", "expected_chain",
    "input_position", "expected_position", "forward_mode", "batch_size", "repeat",
)
RING_OVERFLOW_KEYS: tuple[str, ...] = (
    TYPE_KEY, "pid", "time", "dropped", "dropped_total", "ring_capacity", "first_index",
    "end_index", "host_step",
)
ABORT_KEYS: tuple[str, ...] = (
    TYPE_KEY, "pid", "time", "rid", "cause", "step", "check", "reasons", "slot", "position",
    "tokens_delivered",
)
CACHE_EVICTION_KEYS: tuple[str, ...] = (
    TYPE_KEY, "pid", "time", "cause", "nodes", "tokens", "locked_nodes", "slots", "rids",
)
REQUIRED_KEYS: Mapping[str, tuple[str, ...]] = {
    HEADER: HEADER_KEYS,
    VIOLATION: VIOLATION_KEYS,
    RING_OVERFLOW: RING_OVERFLOW_KEYS,
    ABORT: ABORT_KEYS,
    CACHE_EVICTION: CACHE_EVICTION_KEYS,
}
