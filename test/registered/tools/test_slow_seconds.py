"""``benchmark/slow_seconds.py``: server seconds are judged by their median request cycle
against the run's fastest second, and each class gets the means of what the sampler saw in
those seconds (scheduler main thread on a CPU and waiting, the other threads, the SM clock);
with ``--cpu-probe`` the seconds are also judged by the scheduler's own vCPU's probe; bad
options name the option, the value and what is allowed."""

import datetime
import gzip
import json
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import slow_seconds  # noqa: E402

T0 = int(datetime.datetime(2026, 11, 29, 12, 0, 0, tzinfo=datetime.timezone.utc).timestamp())


def _prefill(second: int, *, cycle_ms: float) -> str:
    stamp = datetime.datetime.fromtimestamp(T0 + second, tz=datetime.timezone.utc)
    return (f"[{stamp:%Y-%m-%d %H:%M:%S}] Prefill batch, #new-seq: 1, #new-token: 128, "
            f"#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, "
            f"input throughput (token/s): {128e3 / cycle_ms:.2f}")


def _sample(t: float, *, sched_ticks: int, sched_wait_ns: int, other_ticks: int,
            sm: int = 1980, faults: int | None = None, probe_us: float | None = None,
            probe_mem_us: float | None = None) -> str:
    """A sampler line; ``faults`` given: the 8-value rows (kernel ticks = a tenth of the
    scheduler's ticks), else the older 6-value ones; ``probe_us`` given: with the probe."""
    scheduler = [10, 10, "sglang::scheduler_TP0", "sglang::schedul", sched_ticks, sched_wait_ns]
    if faults is not None:
        scheduler += [sched_ticks // 10, faults]
    probe = {} if probe_us is None else {"probe_us": probe_us}
    if probe_mem_us is not None:
        probe["probe_mem_us"] = probe_mem_us
    return json.dumps({"t": t, **probe, "gpu": {"sm_mhz": sm, "util": 40}, "threads": [
        scheduler,
        [10, 11, "sglang::scheduler_TP0", "pt_main_thread", 0, 0],
        [20, 20, "/usr/bin/python3 -m sglang.launch_server", "python3", other_ticks, 0],
    ]})


def _write_run(tmp_path: pathlib.Path, *,
               memory: bool = False) -> tuple[pathlib.Path, pathlib.Path]:
    logs = tmp_path / "logs"
    logs.mkdir()
    # off: 2 fast seconds; canary: 1 fast second, then 1 slow one
    (logs / "8b-off-run1.log").write_text("\n".join(
        [_prefill(0, cycle_ms=30.0)] * 6 + [_prefill(1, cycle_ms=31.0)] * 6) + "\n")
    (logs / "8b-canary-run1.log").write_text("\n".join(
        [_prefill(2, cycle_ms=32.0)] * 6 + [_prefill(3, cycle_ms=50.0)] * 6
        + [_prefill(4, cycle_ms=50.0)] * 2) + "\n")  # too few in second 4: not judged
    samples = tmp_path / "samples.jsonl.gz"
    lines = []
    for second in range(5):  # the scheduler at 100 % throughout, 1 % waiting; others 20 %
        for half in (0.0, 0.5):
            t = T0 + second + half
            step = 2 * second + (1 if half else 0)
            lines.append(_sample(t, sched_ticks=50 * step, sched_wait_ns=5_000_000 * step,
                                 other_ticks=10 * step,
                                 probe_us=2000.0 if second == 3 else 1000.0,
                                 probe_mem_us=(600.0 if second == 3 else 300.0) if memory
                                 else None))
    with gzip.open(samples, "wt") as out:
        out.write("\n".join(lines) + "\n")
    return logs, samples


def test_slow_seconds_are_reported_with_what_the_machine_did(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs, samples = _write_run(tmp_path)
    assert slow_seconds.main([str(logs), "--samples", str(samples)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("slow: a second whose median request cycle is over 39.0 ms (1.3 x the "
                      "run's fastest second)")
    assert out[1:3] == [
        "8b-canary-run1.log: 2 seconds, 1 slow, median cycle 41.0 ms; the probe 1500 µs",
        "8b-off-run1.log: 2 seconds, 0 slow, median cycle 30.5 ms; the probe 1000 µs",
    ]
    assert out[3] == ("slow seconds: 1, median cycle 50.0 ms; SM clock 1980.0 MHz, GPU busy 40.0 %; "
                      "scheduler on a CPU 100.0 % (in the kernel - %), waiting 1.0 %, - minor "
                      "faults/s; the other threads 20.0 % of a CPU together, the busiest "
                      "/usr/bin/python3/python3 20 %; the probe 2000.0 µs")
    assert out[4].startswith("fast seconds: 3, median cycle 31.0 ms; SM clock 1980.0 MHz")
    assert out[4].endswith("; the probe 1000.0 µs")
    assert out[5] == ("the probe over the run: p10 / p50 / p90 1000 / 1000 / 2000 µs (10 "
                      "samples); with no SGLang thread running: no samples")


def test_the_probe_spread_sets_an_idle_machine_apart() -> None:
    idle = [json.dumps({"t": T0 + i, "probe_us": value, "gpu": {}, "threads": []})
            for i, value in enumerate((1600.0, 3200.0, 1700.0))]
    busy = _sample(T0 + 9, sched_ticks=0, sched_wait_ns=0, other_ticks=0, probe_us=2000.0)
    assert slow_seconds.probe_spread([*idle, busy]) == [
        "the probe over the run: p10 / p50 / p90 1630 / 1850 / 2840 µs (4 samples); with no "
        "SGLang thread running: p10 / p50 / p90 1620 / 1700 / 2900 µs (3 samples)"
    ]
    memory = json.dumps({"t": T0, "probe_us": 1000.0, "probe_mem_us": 400.0, "threads": []})
    assert slow_seconds.probe_spread([memory])[1] == (
        "the memory probe over the run: 400 µs (1 sample); with no SGLang thread running: 400 "
        "µs (1 sample)")
    assert slow_seconds.probe_spread([_sample(T0, sched_ticks=0, sched_wait_ns=0,
                                              other_ticks=0)]) == []


def test_the_memory_probe_is_reported_where_it_was_sampled(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs, samples = _write_run(tmp_path, memory=True)
    assert slow_seconds.main([str(logs), "--samples", str(samples)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("8b-canary-run1.log: 2 seconds, 1 slow, median cycle 41.0 ms; the probe "
                      "1500 µs; the memory probe 450 µs")
    assert out[3].endswith("; the probe 2000.0 µs, the memory probe 600.0 µs")
    assert out[-1].startswith("the memory probe over the run: p10 / p50 / p90 300 / 300 / ")


def test_sampled_seconds_average_the_rates_ending_in_them() -> None:
    lines = [_sample(T0 + 0.0, sched_ticks=0, sched_wait_ns=0, other_ticks=0, faults=0),
             _sample(T0 + 0.5, sched_ticks=50, sched_wait_ns=0, other_ticks=0, sm=1000,
                     faults=100),
             _sample(T0 + 1.0, sched_ticks=70, sched_wait_ns=250_000_000, other_ticks=25, sm=2000,
                     faults=1100)]
    seconds = slow_seconds.sampled_seconds(lines)
    assert set(seconds) == {T0, T0 + 1}
    first = seconds[T0]
    assert first.scheduler_cpu == pytest.approx(1.0) and first.sm_mhz == 1000
    assert (first.scheduler_kernel, first.scheduler_faults_per_s) == pytest.approx((0.1, 200.0))
    later = seconds[T0 + 1]
    assert (later.scheduler_cpu, later.scheduler_wait, later.others_cpu) == pytest.approx(
        (0.4, 0.5, 0.5))
    assert (later.scheduler_kernel, later.scheduler_faults_per_s) == pytest.approx((0.04, 2000.0))
    assert later.busiest_other[1] == pytest.approx(0.5)
    older = slow_seconds.sampled_seconds(
        [_sample(T0 + k / 2, sched_ticks=k, sched_wait_ns=0, other_ticks=0) for k in range(3)])
    assert older[T0].scheduler_kernel is None and older[T0].scheduler_faults_per_s is None
    assert older[T0].probe_us is None


def test_a_cpu_probe_judges_the_seconds_by_the_schedulers_vcpu(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs, samples = _write_run(tmp_path)
    cpu_probe = tmp_path / "cpu15.jsonl"
    cpu_probe.write_text("".join(  # --probe-only lines: the vCPU slow in second 3 only
        json.dumps({"t": T0 + second + half, "probe_us": 2000.0 if second == 3 else 1000.0})
        + "\n" for second in range(5) for half in (0.0, 0.5)))
    assert slow_seconds.main([str(logs), "--samples", str(samples),
                              "--cpu-probe", str(cpu_probe)]) == 0
    out = capsys.readouterr().out.splitlines()
    # the vCPU's probes in the seconds slow by their request cycle (canary's second 3) and not
    assert out[-2:] == [
        "the scheduler's CPU in the seconds slow by request cycle (over 39.0 ms): 1 seconds, "
        "probe median 2000 µs, memory probe median -",
        "the scheduler's CPU in the other seconds: 3 seconds, probe median 1000 µs, memory "
        "probe median -",
    ]
    out = out[:-2]
    assert out[-5:] == [
        "the scheduler's CPU (--cpu-probe): a second is fast when its probe is under 1150 µs "
        "(1.15 x its p10 over the run)",
        "8b-canary-run1.log: 2 seconds with a probe, 1 fast; median cycle 32.0 ms in the fast "
        "ones, 50.0 ms in the slow",
        "8b-off-run1.log: 2 seconds with a probe, 2 fast; median cycle 30.5 ms in the fast ones, "
        "- in the slow",
        "canary (1 server): median cycle 32.0 ms over its 1 fast seconds",
        "off (1 server): median cycle 30.5 ms over its 2 fast seconds",
    ]
    # with the memory probe: a second whose memory probe alone is slow is a slow second
    cpu_probe.write_text("".join(
        json.dumps({"t": T0 + second + half, "probe_us": 2000.0 if second == 3 else 1000.0,
                    "probe_mem_us": 900.0 if second == 0 else 300.0})
        + "\n" for second in range(5) for half in (0.0, 0.5)))
    assert slow_seconds.main([str(logs), "--samples", str(samples),
                              "--cpu-probe", str(cpu_probe)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].endswith("probe median 1000 µs, memory probe median 300 µs")
    out = out[:-2]
    assert out[-5] == ("the scheduler's CPU (--cpu-probe): a second is fast when its probe is "
                       "under 1150 µs and its memory probe under 345 µs (1.15 x their p10 over "
                       "the run)")
    assert out[-3] == ("8b-off-run1.log: 2 seconds with a probe, 1 fast; median cycle 31.0 ms in "
                       "the fast ones, 30.0 ms in the slow")
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"t": T0, "probe_us": 1000.0}) + "\n")
    assert slow_seconds.main([str(logs), "--samples", str(samples), "--cpu-probe", str(one)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "--cpu-probe: fewer than two seconds with a probe")


@pytest.mark.parametrize("argv,fragment", [
    (["--min-requests", "0"], "--min-requests=0 is invalid; allowed: an integer >= 1"),
    (["--slow-factor", "1"], "--slow-factor=1.0 is invalid; allowed: > 1"),
    (["--fast-factor", "0.9"], "--fast-factor=0.9 is invalid; allowed: > 1"),
    (["--cpu-probe", "/no/such/cpu15.jsonl"], "/no/such/cpu15.jsonl does not exist"),
])
def test_bad_options_name_the_option(argv: list[str], fragment: str, tmp_path: pathlib.Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    logs, samples = _write_run(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        slow_seconds.main([str(logs), "--samples", str(samples), *argv])
    assert stopped.value.code == 2
    assert fragment in capsys.readouterr().err


def test_a_missing_input_is_named(tmp_path: pathlib.Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        slow_seconds.main([str(tmp_path / "none"), "--samples", str(tmp_path / "x.jsonl")])
    assert "none does not exist" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
