"""Prometheus metrics of the canary, through SGLang's own metrics machinery (``--enable-metrics``).

One job: count what the monitor already learns on the host into prometheus_client counters.
SGLang runs prometheus_client in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set before the
scheduler processes start): each scheduler process writes its values to files in that directory
and the HTTP server's ``/metrics`` merges the files of every process. The canary runs in the
scheduler process, so its counters appear on SGLang's ``/metrics`` beside ``sglang:*``.

==================================  ============================================================
``kv_canary_violations_total``      one per reason label of each violation row (a row with two
                                    reasons counts under both), labels ``reason``, ``check``
``kv_canary_slots_verified_total``  slot verifications (pre- plus post-forward, the stats
                                    line's "protected ... (slots verified)")
``kv_canary_ring_dropped_total``    violation rows a full ring dropped (never read)
``kv_canary_health_checks_total``   periodic device-agreement health checks, label ``result``
                                    (``ok`` / ``failed``)
``kv_canary_requests_aborted_total``    abort mode: requests finished with the canary's error,
                                        label ``cause`` (``violation``, ``cache``, ...)
``kv_canary_cache_nodes_evicted_total`` abort mode: radix-cache nodes made unmatchable
==================================  ============================================================

Every series also carries ``pool`` (``target``, or ``draft`` for an EAGLE draft model's canary)
and the labels SGLang's scheduler puts on its own metrics (``model_name``, ``engine_type``,
``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``dp_rank`` with data parallelism, and
``--extra-metric-labels``): the ranks' series never clash.

The values come from what the host already has, never from a device read or a host sync: the
violation rows, repeat flags and dropped counts of each report (:class:`CanaryMetrics` is a
:class:`~.violation_reporter.ReportSink`), the deltas between two counter snapshots the monitor
read, and the result of each health check it ran. Log mode's suppressed repeats are counted too.

Imported and built only with the canary on and ``server_args.enable_metrics`` (nothing of
prometheus_client is imported otherwise). The counters are created once per process (a target
and a draft canary share them, their ``pool`` label tells them apart), registered with
prometheus_client's default registry as SGLang's collector does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
from sglang.srt.kv_canary.monitor.violations import ViolationRow

if TYPE_CHECKING:
    from sglang.srt.kv_canary.monitor.containment_records import AbortRecord, EvictionRecord

logger = logging.getLogger(__name__)

VIOLATIONS = "kv_canary_violations_total"
SLOTS_VERIFIED = "kv_canary_slots_verified_total"
RING_DROPPED = "kv_canary_ring_dropped_total"
HEALTH_CHECKS = "kv_canary_health_checks_total"
REQUESTS_ABORTED = "kv_canary_requests_aborted_total"
CACHE_NODES_EVICTED = "kv_canary_cache_nodes_evicted_total"
POOL_LABEL = "pool"
HEALTH_OK = "ok"
HEALTH_FAILED = "failed"
METRICS_ERROR_PREFIX = "kv_canary metrics:"


def scheduler_labels(
    *, server_args: Any, tp_rank: int, pp_rank: int, moe_ep_rank: int, dp_rank: int | None
) -> dict[str, str]:
    """The labels SGLang's scheduler puts on its metrics (its ``init_metrics``), in its order:
    ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``dp_rank``
    (only when not None), then ``server_args.extra_metric_labels``. Not its ``priority`` label
    (that one splits its queue gauges by request priority)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    labels = {
        "model_name": str(server_args.served_model_name),
        "engine_type": DisaggregationMode.to_engine_type(server_args.disaggregation_mode),
        "tp_rank": str(tp_rank),
        "pp_rank": str(pp_rank),
        "moe_ep_rank": str(moe_ep_rank),
    }
    if dp_rank is not None:
        labels["dp_rank"] = str(dp_rank)
    labels.update({str(k): str(v) for k, v in (server_args.extra_metric_labels or {}).items()})
    return labels


@dataclass(frozen=True, slots=True, kw_only=True)
class _Families:
    """The process's canary counters (created once: prometheus_client refuses a second metric
    of one name in a registry, and two in one process would overwrite each other's files)."""

    label_names: tuple[str, ...]  # without the per-metric ones (reason, check, result)
    violations: Counter
    slots_verified: Counter
    ring_dropped: Counter
    health_checks: Counter
    requests_aborted: Counter
    cache_nodes_evicted: Counter


_families: _Families | None = None


def _process_families(label_names: tuple[str, ...]) -> _Families:
    """This process's counters, created at the first call.

    Raises:
        ValueError: an earlier call used other label names.
    """
    global _families
    if _families is None:
        names = list(label_names)
        _families = _Families(
            label_names=label_names,
            violations=Counter(
                name=VIOLATIONS,
                documentation="KV canary violations: one per reason label of each violation row "
                "(a row with two reasons counts under both), including rows log mode did not "
                "print as repeats of a corruption still present.",
                labelnames=[*names, "reason", "check"],
            ),
            slots_verified=Counter(
                name=SLOTS_VERIFIED,
                documentation="KV canary slot verifications (pre- plus post-forward; a prefix "
                "slot counts once per forward that reads it), from the counter snapshots read.",
                labelnames=names,
            ),
            ring_dropped=Counter(
                name=RING_DROPPED,
                documentation="KV canary violation rows dropped unread because the violation "
                "ring was full (see SGLANG_KV_CANARY_RING_CAPACITY).",
                labelnames=names,
            ),
            health_checks=Counter(
                name=HEALTH_CHECKS,
                documentation="KV canary periodic health checks (device kernel runs against "
                "host launches), by result ok or failed.",
                labelnames=[*names, "result"],
            ),
            requests_aborted=Counter(
                name=REQUESTS_ABORTED,
                documentation="KV canary abort mode: requests finished with the canary's error "
                "(HTTP 500 / an abort chunk), by cause.",
                labelnames=[*names, "cause"],
            ),
            cache_nodes_evicted=Counter(
                name=CACHE_NODES_EVICTED,
                documentation="KV canary abort mode: radix-cache nodes evicted because they held "
                "a reported slot or a reported request's prefix.",
                labelnames=names,
            ),
        )
    elif _families.label_names != label_names:
        raise ValueError(
            f"KV canary metrics: label names {label_names} differ from this process's "
            f"{_families.label_names}"
        )
    return _families


class CanaryMetrics:
    """One canary's series: the report sink of its violation reporter, and told by its monitor
    of each counter snapshot read and each health check run. Cold path (reports) and a few
    integer operations per snapshot read; never raises (a failed write of the values is logged
    once)."""

    def __init__(self, *, families: _Families, labels: Mapping[str, str]) -> None:
        self._labels = dict(labels)
        self._violations = families.violations
        self._violation_series: dict[tuple[str, str], Any] = {}  # (reason, check) -> child
        # the series that exist from start-up (0 until counted)
        self._slots_verified = families.slots_verified.labels(**self._labels)
        self._ring_dropped = families.ring_dropped.labels(**self._labels)
        self._health = {
            ok: families.health_checks.labels(**self._labels, result=result)
            for ok, result in ((True, HEALTH_OK), (False, HEALTH_FAILED))
        }
        self._requests_aborted = families.requests_aborted
        self._aborted_series: dict[str, Any] = {}  # cause -> child
        self._nodes_evicted = families.cache_nodes_evicted.labels(**self._labels)
        self._failed_writes = 0

    def record_containment(
        self, *, aborts: Sequence[AbortRecord], evictions: Sequence[EvictionRecord]
    ) -> None:
        """Abort mode did this: count each aborted request under its cause and the evicted
        nodes. Never raises."""
        try:
            for record in aborts:
                cause = record.cause.value
                child = self._aborted_series.get(cause)
                if child is None:
                    child = self._aborted_series[cause] = self._requests_aborted.labels(
                        **self._labels, cause=cause)
                child.inc()
            nodes = sum(record.nodes for record in evictions)
            if nodes:
                self._nodes_evicted.inc(nodes)
        except OSError as exc:
            self._write_failed(exc)

    def record(
        self, *, rows: Sequence[ViolationRow], repeats: Sequence[bool], dropped: int,
        dropped_total: int, first_index: int, end_index: int,
    ) -> None:
        """Count one report: every row (repeats too) under each of its reason labels, and the
        ``dropped`` rows. Never raises."""
        try:
            for row in rows:
                check = row.check.name.lower()
                for reason in row.reason_labels:
                    self._violation_child(reason=reason, check=check).inc()
            if dropped:
                self._ring_dropped.inc(dropped)
        except OSError as exc:
            self._write_failed(exc)

    def snapshot_read(self, *, previous: CounterSnapshot, latest: CounterSnapshot) -> None:
        """The monitor replaced its newest snapshot ``previous`` by ``latest``: count the slot
        verifications in between (none when the counters went back, after a reset). Never
        raises."""
        delta = latest.slots_verified - previous.slots_verified
        if delta <= 0:
            return
        try:
            self._slots_verified.inc(delta)
        except OSError as exc:
            self._write_failed(exc)

    def health_checked(self, *, ok: bool) -> None:
        """The monitor ran a periodic health check (``ok``: it passed). Never raises."""
        try:
            self._health[ok].inc()
        except OSError as exc:
            self._write_failed(exc)

    def _violation_child(self, *, reason: str, check: str) -> Any:
        child = self._violation_series.get((reason, check))
        if child is None:
            child = self._violation_series[(reason, check)] = self._violations.labels(
                **self._labels, reason=reason, check=check
            )
        return child

    def _write_failed(self, exc: OSError) -> None:
        self._failed_writes += 1
        if self._failed_writes == 1:
            logger.error(
                f"{METRICS_ERROR_PREFIX} updating the prometheus counters failed "
                f"({exc.strerror or exc}); the log still has every violation line"
            )


def build_canary_metrics(
    *, server_args: Any, pool: str, tp_rank: int, pp_rank: int, moe_ep_rank: int,
    dp_rank: int | None,
) -> CanaryMetrics:
    """One canary's metrics: the process's counters (created at the first call) with SGLang's
    scheduler labels (:func:`scheduler_labels`) and ``pool`` (``target`` or ``draft``).

    Raises:
        ValueError: another canary of this process was built with other label names.
    """
    labels = scheduler_labels(server_args=server_args, tp_rank=tp_rank, pp_rank=pp_rank,
                              moe_ep_rank=moe_ep_rank, dp_rank=dp_rank)
    labels[POOL_LABEL] = pool
    return CanaryMetrics(families=_process_families(tuple(labels)), labels=labels)
