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


def test_batches_name_the_scenarios_and_bad_items_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_extend_host.parse_batches("1x128, 64x512") == ((1, 128), (64, 512))
    for bad in ("1x0", "0x128", "128", "1x", "ax2"):
        with pytest.raises(SystemExit) as stopped:
            bench_extend_host.main(["--batches", bad])
        assert stopped.value.code == 2
        assert (f"--batches item {bad!r} is invalid; allowed: REQUESTSxPROMPT with integers >= 1"
                in capsys.readouterr().err)


def test_a_run_measures_the_batches_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_extend_host.main(["--forwards", "1", "--batches", "1x16"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()]
    assert len(rows) == 1 and rows[0].startswith("1 x 16 ")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
