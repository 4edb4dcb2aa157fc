"""``benchmark/bench_decode_host.py`` runs on a CPU: both per-step hooks are timed over steady
decode steps that take the unit-step pack (the path a server's decode steps take), and bad
arguments are refused with the flag, the value and what is allowed."""

import pathlib
import sys

import pytest

from sglang.srt.kv_canary.runner.request_rows import RequestRows
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

import bench_decode_host  # noqa: E402


def test_a_small_run_times_both_hooks_over_unit_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    unit_steps = 0
    original = RequestRows._pack_unit_step

    def counting(self: RequestRows, **kwargs: object) -> object:
        nonlocal unit_steps
        unit_steps += 1
        return original(self, **kwargs)

    monkeypatch.setattr(RequestRows, "_pack_unit_step", counting)
    init_new, run_forward = bench_decode_host.measure(requests=3, steps=5)
    assert init_new > 0 and run_forward > 0
    assert unit_steps >= 5  # every measured step (and the warm-up ones) took the unit-step pack


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps=0 is invalid; allowed: an integer >= 1"),
        (["--batches", "1,x"], "--batches='1,x' is invalid; allowed: integers >= 1"),
        (["--batches", "0"], "--batches='0' is invalid; allowed: integers >= 1"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench_decode_host.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
