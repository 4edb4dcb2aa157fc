"""``benchmark/bench_request_host.py`` runs on a CPU: every part of a batch-1 request's canary
host work (the prefill's hooks and its first decode step's) is timed, the launches a request
makes are counted, the hooks are restored afterwards, and bad arguments are refused with the
flag, the value and what is allowed."""

import pathlib
import sys

import pytest

from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

import bench_request_host  # noqa: E402


@pytest.mark.parametrize(("config", "launches"), [("canary", 4), ("all-checks", 7)])
def test_a_small_run_times_every_part_and_counts_the_launches(config: str, launches: int) -> None:
    hooks = {name: getattr(CanaryRunner, name) for name, _ in bench_request_host.PARTS}
    cost = bench_request_host.measure(config=config, requests=4, prompt=16)
    assert set(cost.parts) == set(bench_request_host.PARTS)
    assert all(value > 0 for value in cost.parts.values())
    assert cost.total == pytest.approx(sum(cost.parts.values()))
    # the prefill's and the decode step's pre and post launches; every check adds the token
    # history's launches (two scatters and the decode step's append)
    assert cost.launches == launches
    assert {name: getattr(CanaryRunner, name) for name in hooks} == hooks


def test_main_prints_one_row_per_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_request_host.main(["--requests", "2", "--prompt", "8",
                                    "--configs", "canary"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert "launch_after_model[EXTEND]" in header and "on_init_new[DECODE]" in header
    assert row.split()[0] == "canary" and row.split()[-1] == "4.00"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "--requests=0 is invalid; allowed: an integer >= 1"),
        (["--prompt", "0"], "--prompt=0 is invalid; allowed: an integer >= 1"),
        (["--configs", "canary,fast"], "--configs='canary,fast': unknown ['fast']; allowed: "
                                       "canary, all-checks"),
    ],
)
def test_bad_arguments_are_refused(argv: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench_request_host.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
