"""The canary's prometheus metrics (``--enable-metrics``): every violation row counts once per
reason label (repeats too), dropped rows, slot verifications as deltas of the snapshots the
monitor read, health checks by result; SGLang's scheduler labels keep the ranks' series apart in
multiprocess mode; with metrics off nothing of prometheus_client is imported.

Whatever creates metrics runs in a fresh interpreter with its own ``PROMETHEUS_MULTIPROC_DIR``
(prometheus_client picks its value class at import and creates each metric once per process);
this process only reads the directory back, as SGLang's ``/metrics`` does."""

import logging
import pathlib
import sys
from dataclasses import dataclass

import pytest
import torch

from sglang.jit_kernel.kv_canary import publish_counters_ref
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    NUM_COUNTERS,
    RING_ROW_FIELDS,
    CheckKind,
)
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
from sglang.srt.kv_canary.monitor.health import CanaryHealthError, PER_FORWARD_KINDS
from sglang.srt.kv_canary.monitor.monitor import CanaryMonitor
from sglang.srt.kv_canary.monitor.report_sinks import ReportFanOut, combine_sinks
from sglang.test.ci.ci_register import register_cpu_ci

from _prometheus import read_metrics, run_fresh, value

register_cpu_ci(est_time=30, suite="kv-canary-cpu")

_FEED = """
    import sys
    from types import SimpleNamespace
    from sglang.jit_kernel.kv_canary.consts import COUNTER_ENTRIES, NUM_COUNTERS, CheckKind, Reason
    from sglang.srt.kv_canary.monitor.counter_snapshots import ZERO_SNAPSHOT, CounterSnapshot
    from sglang.srt.kv_canary.monitor.metrics import build_canary_metrics
    from sglang.srt.kv_canary.monitor.violations import ViolationRow

    tp_rank = {tp_rank}
    server_args = SimpleNamespace(served_model_name="tiny", disaggregation_mode="null",
                                  extra_metric_labels={{"cluster": "a"}})
    target, draft = (
        build_canary_metrics(server_args=server_args, pool=pool, tp_rank=tp_rank, pp_rank=0,
                             moe_ep_rank=0, dp_rank=None)
        for pool in ("target", "draft")
    )

    def row(check, reasons, slot):
        return ViolationRow(check=check, reasons=reasons, req_pool_idx=1, slot=slot, position=2,
                            stored_token=3, expected_token=4, stored_chain=None,
                            expected_chain=None, input_position=None, expected_position=None,
                            step=5)

    both = int(Reason.VERIFY_POSITION) | int(Reason.VERIFY_CHAIN)
    target.record(rows=[row(CheckKind.PRE_VERIFY, both, 7),
                        row(CheckKind.PRE_VERIFY, both, 7),
                        row(CheckKind.WRITE, int(Reason.WRITE_TOKEN), 8)],
                  repeats=[False, True, False], dropped=3, dropped_total=3, first_index=0,
                  end_index=6)
    target.record(rows=[], repeats=[], dropped=0, dropped_total=3, first_index=6, end_index=6)
    draft.record(rows=[row(CheckKind.POST_VERIFY, int(Reason.VERIFY_TOKEN), 9)],
                 repeats=[False], dropped=0, dropped_total=0, first_index=0, end_index=1)

    def snapshot(pre, post, sweep=0):
        counters = [0] * NUM_COUNTERS
        counters[COUNTER_ENTRIES + CheckKind.PRE_VERIFY] = pre
        counters[COUNTER_ENTRIES + CheckKind.POST_VERIFY] = post
        counters[COUNTER_ENTRIES + CheckKind.SWEEP] = sweep  # swept slots are not verifications
        return CounterSnapshot(steps=1, launches=1, sweep_launches=0, counters=tuple(counters))

    first, second = snapshot(10, 5, sweep=100), snapshot(12, 6, sweep=200)
    target.snapshot_read(previous=ZERO_SNAPSHOT, latest=first)
    target.snapshot_read(previous=first, latest=second)
    target.snapshot_read(previous=second, latest=snapshot(1, 0))  # counters reset: nothing
    target.snapshot_read(previous=ZERO_SNAPSHOT, latest=snapshot(1, 1))  # after discard_pending
    for ok in (True, True, False):
        target.health_checked(ok=ok)
"""


def test_reports_snapshots_and_health_checks_are_counted(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "prometheus"
    run_fresh(_FEED.format(tp_rank=0), directory=directory, monkeypatch=monkeypatch)
    samples = read_metrics(directory)
    base = dict(model_name="tiny", engine_type="unified", tp_rank="0", pp_rank="0",
                moe_ep_rank="0", cluster="a")
    violations = "kv_canary_violations_total"
    pre = dict(base, pool="target", check="pre_verify")
    # a row with two reasons counts under both; the repeat counts too
    assert value(samples, violations, **pre, reason="verify_position") == 2
    assert value(samples, violations, **pre, reason="verify_chain_hash") == 2
    assert value(samples, violations, **base, pool="target", check="write",
                 reason="write_token") == 1
    assert value(samples, violations, **base, pool="draft", check="post_verify",
                 reason="verify_token") == 1
    assert sum(v for (n, _), v in samples.items() if n == violations) == 6
    assert value(samples, "kv_canary_ring_dropped_total", **base, pool="target") == 3
    assert value(samples, "kv_canary_ring_dropped_total", **base, pool="draft") == 0
    assert value(samples, "kv_canary_slots_verified_total", **base, pool="target") == 18 + 2
    assert value(samples, "kv_canary_slots_verified_total", **base, pool="draft") == 0
    health = "kv_canary_health_checks_total"
    assert value(samples, health, **base, pool="target", result="ok") == 2
    assert value(samples, health, **base, pool="target", result="failed") == 1
    assert value(samples, health, **base, pool="draft", result="ok") == 0
    # every series carries the scheduler's labels and the pool, nothing else
    for name, labels in samples:
        extra = {"reason", "check"} if name == violations else \
            {"result"} if name == health else set()
        assert {key for key, _ in labels} == set(base) | {"pool"} | extra, (name, labels)


def test_two_tensor_parallel_ranks_keep_their_own_series(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "prometheus"
    for rank in (0, 1):
        run_fresh(_FEED.format(tp_rank=rank), directory=directory, monkeypatch=monkeypatch)
    samples = read_metrics(directory)
    for rank in ("0", "1"):
        assert value(samples, "kv_canary_slots_verified_total", tp_rank=rank,
                     pool="target") == 20
        assert value(samples, "kv_canary_health_checks_total", tp_rank=rank, pool="target",
                     result="failed") == 1


_METRICS_OFF = """
    import sys
    from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
    from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
    from sglang.srt.kv_canary.selfcheck.scenarios import install_canary_runner
    from sglang.srt.kv_canary.selfcheck.simulation import default_server
    server = default_server(page_size=4, forward=lambda batch: None)
    assert not server.runner.server_args.enable_metrics
    runner = install_canary_runner(model_runner=server.runner,
                                   config=CanaryConfig(mode=CanaryMode.LOG),
                                   kernels=load_kernels(KernelBackend.TORCH_REFERENCE))
    assert runner.monitor._metrics is None and runner.monitor._reporter._sink is None
    loaded = [name for name in sys.modules
              if name.startswith(("prometheus_client", "sglang.srt.kv_canary.monitor.metrics"))]
    print("LOADED:" + ",".join(loaded))
"""


def test_with_metrics_off_nothing_of_prometheus_is_imported_or_written(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "prometheus"
    out = run_fresh(_METRICS_OFF, directory=directory, monkeypatch=monkeypatch)
    assert out.strip().splitlines()[-1] == "LOADED:"
    assert list(directory.iterdir()) == []


@dataclass(slots=True)
class _RecordingMetrics:
    snapshots: list[tuple[CounterSnapshot, CounterSnapshot]]
    health: list[bool]

    def snapshot_read(self, *, previous: CounterSnapshot, latest: CounterSnapshot) -> None:
        self.snapshots.append((previous, latest))

    def health_checked(self, *, ok: bool) -> None:
        self.health.append(ok)


class _State:
    """The two tensors the monitor reads (ring, counters), on the CPU."""

    def __init__(self) -> None:
        self.ring = torch.zeros((8, RING_ROW_FIELDS), dtype=torch.int64)
        self.counters = torch.zeros((NUM_COUNTERS,), dtype=torch.int64)


def test_the_monitor_tells_its_metrics_each_snapshot_and_health_check(caplog) -> None:
    """Each snapshot read is handed over with the one it replaces (so deltas add up to the
    newest snapshot's counts), each health check with its result, a failed one before it
    raises."""
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    state = _State()
    metrics = _RecordingMetrics(snapshots=[], health=[])
    monitor = CanaryMonitor(
        state=state, config=CanaryConfig(mode=CanaryMode.LOG, health_check_every_n_steps=2),
        seal=publish_counters_ref.launch_publish_counters, metrics=metrics,
    )
    for step in range(1, 5):
        monitor.poll(whole=True)
        for kind in PER_FORWARD_KINDS:
            state.counters[COUNTER_KERNEL_RUNS + kind] += 1
        state.counters[COUNTER_ENTRIES + CheckKind.PRE_VERIFY] += 3
        state.counters[COUNTER_ENTRIES + CheckKind.POST_VERIFY] += 2
        monitor.publish()
        monitor.after_forward(steps=step, launches=step, publications=step)
    monitor.poll(whole=True)
    assert metrics.health == [True, True]
    assert [previous for previous, _ in metrics.snapshots[1:]] == [
        latest for _, latest in metrics.snapshots[:-1]]
    assert metrics.snapshots[-1][1] == monitor.latest and monitor.latest.slots_verified == 20
    assert sum(b.slots_verified - a.slots_verified for a, b in metrics.snapshots) == 20
    # steps 5 and 6 enqueue launches the device never runs: the check at step 6 fails
    monitor.publish()
    monitor.after_forward(steps=5, launches=5, publications=5)
    monitor.poll(whole=True)
    monitor.publish()
    with pytest.raises(CanaryHealthError):
        monitor.after_forward(steps=6, launches=6, publications=6)
    assert metrics.health == [True, True, False]


def test_sinks_combine_into_none_one_or_a_fan_out() -> None:
    calls: list[tuple[str, int]] = []

    class Sink:
        def __init__(self, name: str) -> None:
            self.name = name

        def record(self, *, rows, repeats, dropped, dropped_total, first_index, end_index):
            calls.append((self.name, dropped))

    first, second = Sink("first"), Sink("second")
    assert combine_sinks(sinks=(None, None)) is None
    assert combine_sinks(sinks=(None, second)) is second
    fan_out = combine_sinks(sinks=(first, None, second))
    assert isinstance(fan_out, ReportFanOut) and fan_out.sinks == (first, second)
    fan_out.record(rows=[], repeats=[], dropped=2, dropped_total=2, first_index=0, end_index=2)
    assert calls == [("first", 2), ("second", 2)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
