"""``benchmark/bench_process_speed.py`` on any Linux machine: one child times the work on every
CPU it may use, fresh children time it on one CPU (every other one with the variant environment,
which reaches that child only), and bad options name the option, the value and what is
allowed."""

import os
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import bench_process_speed as bench  # noqa: E402


def test_every_cpu_and_every_fresh_process_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--passes", "2", "--processes", "3", "--slice-ms", "2",
                       "--variant-env", "KV_CANARY_PROCESS_SPEED_PROBE=1"]) == 0
    out = capsys.readouterr().out
    cpus = sorted(os.sched_getaffinity(0))
    for cpu in cpus:
        assert f"  cpu {cpu:>3}: " in out
    assert "between CPUs (their medians): max/min " in out
    assert f"each on CPU {cpus[-1]}; every other one with KV_CANARY_PROCESS_SPEED_PROBE=1" in out
    assert [line.split(":")[0].strip() for line in out.splitlines()
            if line.startswith("  process ")] == [
        "process  1 (default)", "process  2 (variant)", "process  3 (default)"]
    assert "default: median " in out and "over 2 processes" in out
    assert "variant: median " in out and "over 1 processes" in out


def test_the_variant_environment_reaches_only_its_children(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def run(command: list[str], *, env: dict[str, str], **_: object):
        mode = command[command.index("--child") + 1]
        if mode == "per-cpu":
            return bench.subprocess.CompletedProcess(command, 0, stdout='{"0": [1.0]}\n')
        seen.append(env.get("KV_CANARY_PROCESS_SPEED_PROBE"))
        return bench.subprocess.CompletedProcess(command, 0, stdout='{"unit_us": 1.0}\n')

    monkeypatch.setattr(bench.subprocess, "run", run)
    assert bench.main(["--processes", "4", "--variant-env",
                       "KV_CANARY_PROCESS_SPEED_PROBE=1"]) == 0
    assert seen == [None, "1", None, "1"]


@pytest.mark.parametrize("argv,fragment", [
    (["--passes", "0"], "--passes=0 is invalid; allowed: an integer >= 1"),
    (["--processes", "0"], "--processes=0 is invalid; allowed: an integer >= 1"),
    (["--slice-ms", "0"], "--slice-ms=0.0 is invalid; allowed: > 0"),
    (["--variant-env", "NOVALUE"], "--variant-env='NOVALUE' is invalid; allowed: KEY=VALUE"),
])
def test_bad_options_name_the_option(argv: list[str], fragment: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert fragment in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
