"""``benchmark/cpu_contention.py``: steal per CPU and the scheduler's on-CPU and waiting time are
read from ``/proc`` texts and turned into fractions of the wall time; what cannot be read is
None, never a made-up 0; a workload result keeps the reading through its JSON."""

import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import cpu_contention  # noqa: E402
from server_overhead_table import WorkloadResult  # noqa: E402


def _proc_stat(steal: dict[int, int]) -> str:
    lines = ["cpu  100 0 50 1000 0 0 0 %d 0 0" % sum(steal.values())]
    lines += [f"cpu{cpu} 10 0 5 100 0 0 0 {ticks} 0 0" for cpu, ticks in steal.items()]
    lines += ["intr 12345 0 0", "ctxt 999", "btime 1700000000"]
    return "\n".join(lines) + "\n"


def _fake_proc(root: pathlib.Path, *, steal: dict[int, int],
               schedstat: dict[int, str] | None = None) -> pathlib.Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(_proc_stat(steal))
    for pid, text in (schedstat or {}).items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "schedstat").write_text(text)
    return root


def test_steal_is_the_eighth_value_of_each_cpu_line() -> None:
    text = _proc_stat({0: 7, 1: 0, 15: 123})
    assert cpu_contention.parse_steal_ticks(text) == {0: 7, 1: 0, 15: 123}
    assert cpu_contention.parse_steal_ticks("cpu0 1 2 3 4\n") == {0: 0}  # no steal field


def test_schedstat_gives_on_cpu_and_waiting_ns() -> None:
    assert cpu_contention.parse_schedstat("5000000000 2500000 1234\n") == (5_000_000_000, 2_500_000)
    with pytest.raises(ValueError, match="fewer than two values"):
        cpu_contention.parse_schedstat("17")


def test_two_snapshots_give_fractions_of_the_wall_time(tmp_path: pathlib.Path) -> None:
    clock = iter([10.0, 12.0])
    before = cpu_contention.take_snapshot(
        scheduler_pid=42, clock=lambda: next(clock),
        proc=_fake_proc(tmp_path / "a", steal={0: 0, 1: 0, 14: 0, 15: 0},
                        schedstat={42: "1000000000 0 10"}))
    after = cpu_contention.take_snapshot(
        scheduler_pid=42, clock=lambda: next(clock),
        proc=_fake_proc(tmp_path / "b", steal={0: 0, 1: 0, 14: 40, 15: 20},
                        schedstat={42: "2900000000 50000000 30"}))
    use = cpu_contention.cpu_use(before, after, scheduler_cpus={14, 15}, ticks_per_s=100)
    # 60 ticks = 0.6 s of steal over 4 CPUs x 2 s, 0.6 s over the scheduler's 2 CPUs x 2 s
    assert use.seconds == 2.0
    assert use.steal_all == pytest.approx(0.075)
    assert use.steal_scheduler == pytest.approx(0.15)
    assert use.scheduler_on_cpu == pytest.approx(0.95)
    assert use.scheduler_waiting == pytest.approx(0.025)
    assert use.describe() == ("steal 7.50 % of all CPUs, 15.00 % of the scheduler's, scheduler "
                              "on a CPU 95.0 %, waiting 2.50 % (over 2.0 s)")


def test_what_cannot_be_read_is_none_not_zero(tmp_path: pathlib.Path) -> None:
    clock = iter([0.0, 1.0])
    missing = tmp_path / "no-proc"
    before = cpu_contention.take_snapshot(scheduler_pid=7, proc=missing, clock=lambda: next(clock))
    after = cpu_contention.take_snapshot(scheduler_pid=7, proc=missing, clock=lambda: next(clock))
    assert before.steal_ticks == {} and before.scheduler_ns is None
    use = cpu_contention.cpu_use(before, after, scheduler_cpus={3}, ticks_per_s=100)
    assert (use.steal_all, use.steal_scheduler, use.scheduler_on_cpu,
            use.scheduler_waiting) == (None, None, None, None)
    assert use.describe() == "nothing read (over 1.0 s)"


def test_snapshots_out_of_order_are_refused() -> None:
    snapshot = cpu_contention.CpuSnapshot(wall_s=5.0, steal_ticks={}, scheduler_ns=None)
    with pytest.raises(ValueError, match="not later than the first"):
        cpu_contention.cpu_use(snapshot, snapshot, scheduler_cpus=None)


def test_a_workload_result_keeps_its_reading_through_json() -> None:
    use = cpu_contention.CpuUse(seconds=3.0, steal_all=0.01, steal_scheduler=None,
                                scheduler_on_cpu=0.99, scheduler_waiting=0.0)
    result = WorkloadResult(workload="ttft1", status="measured", cpu=use)
    assert WorkloadResult.from_json(result.to_json()) == result
    older = result.to_json()
    del older["cpu"]  # files written before the reading existed
    assert WorkloadResult.from_json(older).cpu is None


def test_this_machine_can_be_read() -> None:
    if not pathlib.Path("/proc/stat").exists():
        pytest.skip("no /proc/stat here")
    import os
    snapshot = cpu_contention.take_snapshot(scheduler_pid=os.getpid())
    assert snapshot.steal_ticks and snapshot.scheduler_ns is not None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
