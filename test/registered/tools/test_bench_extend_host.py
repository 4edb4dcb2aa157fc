"""``benchmark/bench_extend_host.py`` runs on a CPU: every hook of an extend forward is timed (the
canary's host work happened: the forwards ran through it) and the floor is positive."""

import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

import bench_extend_host  # noqa: E402


def test_a_small_run_times_every_hook_and_the_floor() -> None:
    result = bench_extend_host.measure(requests=2, prompt=16, forwards=2)
    assert set(result) == {*bench_extend_host.HOOKS, "floor"}
    assert all(value > 0 for value in result.values())


def test_the_forward_count_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench_extend_host.main(["--forwards", "0"])
    assert stopped.value.code == 2
    assert "--forwards=0 is invalid; allowed: an integer >= 1" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
