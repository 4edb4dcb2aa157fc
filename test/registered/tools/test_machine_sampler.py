"""``benchmark/machine_sampler.py``: thread names and CPU ticks come from /proc stat lines
(names with spaces and parentheses too), only the matching processes' threads are sampled, and
a line is JSON with the wall time (``--probe-only``: the time and the probe, nothing read from
/proc); bad options name the option, the value and what is
allowed."""

import json
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import machine_sampler  # noqa: E402


def _stat(tid: int, name: str, *, utime: int, stime: int, minflt: int = 10) -> str:
    # fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    return f"{tid} ({name}) S 1 1 1 0 -1 4194560 {minflt} 0 0 0 {utime} {stime} 0 0 20 0 1 0\n"


def _process(proc: pathlib.Path, pid: int, cmdline: str, threads: dict[int, tuple[str, int]]) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    for tid, (name, ticks) in threads.items():
        task = proc / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "stat").write_text(_stat(tid, name, utime=ticks, stime=1))
        (task / "schedstat").write_text(f"{ticks * 10**7} {tid * 1000} 5\n")


def test_a_stat_line_gives_the_thread_name_and_its_cpu_ticks() -> None:
    assert machine_sampler.parse_task_stat(
        _stat(7, "python3", utime=120, stime=30, minflt=4567)) == ("python3", 150, 30, 4567)
    assert machine_sampler.parse_task_stat(_stat(8, "a (b) c", utime=1, stime=2)) == (
        "a (b) c", 3, 2, 10)
    with pytest.raises(ValueError, match="not a /proc stat line"):
        machine_sampler.parse_task_stat("garbage")


def test_only_the_matching_processes_are_sampled(tmp_path: pathlib.Path) -> None:
    proc = tmp_path / "proc"
    _process(proc, 100, "sglang::scheduler_TP0", {100: ("sglang::schedul", 50), 101: ("pt_main", 2)})
    _process(proc, 200, "python3 -m sglang.launch_server --port 1", {200: ("python3", 9)})
    _process(proc, 300, "bash run.sh", {300: ("bash", 1)})
    (proc / "stat").write_text("cpu 1 2 3\n")  # not a process
    line = json.loads(machine_sampler.sample_line(match="sglang", gpu=lambda: {"sm_mhz": 1980,
                                                                                "util": 40},
                                                  proc=proc, clock=lambda: 1700000000.25))
    assert line["t"] == 1700000000.25 and line["gpu"] == {"sm_mhz": 1980, "util": 40}
    assert sorted(map(tuple, line["threads"])) == [
        (100, 100, "sglang::scheduler_TP0", "sglang::schedul", 51, 100 * 1000, 1, 10),
        (100, 101, "sglang::scheduler_TP0", "pt_main", 3, 101 * 1000, 1, 10),
        (200, 200, "python3 -m sglang.launch_server --port 1", "python3", 10, 200 * 1000, 1, 10),
    ]
    assert "gpu" not in json.loads(machine_sampler.sample_line(match="sglang", gpu=None, proc=proc))
    assert "probe_us" not in line
    probed = json.loads(machine_sampler.sample_line(match="sglang", gpu=None, proc=proc,
                                                    probe=lambda: 812.345))
    assert probed["probe_us"] == 812.3


def test_the_probe_times_a_fixed_piece_of_work() -> None:
    assert machine_sampler.probe_work(4) == ((((0 * 31 + 0) * 31 + 1) * 31 + 2) * 31 + 3)
    ticks = iter([1_000, 1_812_000])
    assert machine_sampler.probe_us(timer=lambda: next(ticks)) == pytest.approx(1811.0)


def test_the_memory_probe_chases_one_cycle_through_every_entry() -> None:
    chain = machine_sampler.memory_chain(1000, seed=3)
    assert sorted(chain) == list(range(1000))
    index, seen = 0, set()
    for _ in range(1000):
        seen.add(index)
        index = chain[index]
    assert index == 0 and len(seen) == 1000  # one cycle: back at the start after every entry
    ticks = iter([5_000, 3_005_000])
    assert machine_sampler.memory_probe_us(chain, steps=10,
                                           timer=lambda: next(ticks)) == pytest.approx(3000.0)
    with pytest.raises(ValueError, match="at least 2 entries, got 1"):
        machine_sampler.memory_chain(1)


def test_it_writes_lines_until_its_duration_ends(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "samples.jsonl"
    assert machine_sampler.main(["--out", str(out), "--interval-s", "0.01", "--probe",
                                 "--duration-s", "0.05", "--match", "no-such-process-xyz",
                                 "--probe-memory-words", "4096"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all(line["threads"] == [] and line["probe_us"] > 0
                         and line["probe_mem_us"] > 0 for line in lines)


def test_probe_only_writes_the_time_and_the_probe(tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def no_walk(**_: object) -> list:
        raise AssertionError("--probe-only must not walk /proc")

    monkeypatch.setattr(machine_sampler, "thread_rows", no_walk)
    monkeypatch.setattr(machine_sampler, "gpu_reader", no_walk)
    out = tmp_path / "probe.jsonl"
    assert machine_sampler.main(["--out", str(out), "--interval-s", "0.01", "--probe-only",
                                 "--duration-s", "0.05", "--probe-memory-words", "4096"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all(set(line) == {"t", "probe_us", "probe_mem_us"} and line["probe_us"] > 0
                         for line in lines)


@pytest.mark.parametrize("argv,fragment", [
    (["--probe", "--probe-only"], "--probe and --probe-only are exclusive"),
    (["--probe-memory-words", "1"], "--probe-memory-words=1 is invalid; allowed: an integer >= 2"),
    (["--interval-s", "0"], "--interval-s=0.0 is invalid; allowed: > 0"),
    (["--duration-s", "-1"], "--duration-s=-1.0 is invalid; allowed: > 0"),
])
def test_bad_options_name_the_option(argv: list[str], fragment: str, tmp_path: pathlib.Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        machine_sampler.main(["--out", str(tmp_path / "x.jsonl"), *argv])
    assert stopped.value.code == 2
    assert fragment in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
