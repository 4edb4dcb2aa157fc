"""``benchmark/bench_host.py`` and its simulated canary server (``harness/simulated.py``) on a
CPU: the hook adapters a server registers (init_new, forward, sample) are what is timed, every
launch is stubbed, counted and left out (the counter publication's reference still runs), a
decode step leaves its in-model host work out, every mode measures, and the result set is
written."""

import dataclasses
import json
import pathlib
import random
import sys

import pytest

from sglang.srt.kv_canary.config import parse_config
from sglang.srt.kv_canary.runner.kernels import CanaryKernels
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="kv-canary-cpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

import bench_host  # noqa: E402
from harness import host_modes  # noqa: E402
from harness.configs import CONFIGS  # noqa: E402
from harness.simulated import (  # noqa: E402
    PASSED_THROUGH_LAUNCHES,
    ForwardCost,
    TimedCanaryServer,
    stubbed_kernels,
)
from harness.timers import ExcludedTime  # noqa: E402


def _config(name: str):
    return parse_config(CONFIGS[name].canary_env)


def test_every_launch_is_stubbed_counted_and_timed_apart() -> None:
    excluded = ExcludedTime()
    kernels = stubbed_kernels(excluded=excluded)
    launches = [field.name for field in dataclasses.fields(CanaryKernels)
                if field.name != "backend"]
    assert PASSED_THROUGH_LAUNCHES <= set(launches)
    for name in launches:
        if name not in PASSED_THROUGH_LAUNCHES:
            # a no-op that takes any arguments; what it returns is a stubbed launch too (a
            # launch that binds arguments returns the launch to call later)
            returned = getattr(kernels, name)(anything=object())
            returned(more=1)
    assert excluded.calls == 2 * (len(launches) - len(PASSED_THROUGH_LAUNCHES))


def test_a_batch_1_request_times_the_adapters_of_its_two_forwards() -> None:
    server = TimedCanaryServer(config=_config("all-checks"), requests=1, context=64,
                               tokens=256, prefill_tokens=64)
    (request,) = server.new_requests(rng=random.Random(1), count=1,
                                     prompt_tokens=40, max_new_tokens=2, prefix="r")
    server.server.extend([(request, 40)])
    server.server.decode([request])
    prefill, decode = server.take_costs()
    assert (prefill.mode, decode.mode) == ("EXTEND", "DECODE")
    for cost in (prefill, decode):
        assert cost.init_new_us > 0 and cost.forward_us > 0 and cost.in_model_us > 0
        assert cost.launches >= 2  # at least the pre and the post launch
    assert prefill.server_us == pytest.approx(
        prefill.init_new_us + prefill.forward_us + prefill.in_model_us + prefill.sample_us)
    assert decode.server_us == pytest.approx(
        decode.init_new_us + decode.forward_us + decode.sample_us)
    assert decode.sample_us > 0  # the sampled-token append's adapter
    assert server.take_costs() == []


def test_a_forward_cost_keeps_its_parts_in_json() -> None:
    cost = ForwardCost(mode="MIXED", init_new_us=1.0, forward_us=2.0, in_model_us=4.0,
                       sample_us=8.0, launches=3)
    assert cost.to_json() == {"mode": "MIXED", "init_new_us": 1.0, "forward_us": 2.0,
                              "in_model_us": 4.0, "sample_us": 8.0, "launches": 3,
                              "server_us": 15.0}


@pytest.fixture
def small_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mode with two units per round and one warm-up unit (same shapes)."""
    monkeypatch.setattr(host_modes, "MODES", {
        name: dataclasses.replace(mode, units_per_round=2, warm_up_units=1)
        for name, mode in host_modes.MODES.items()})
    monkeypatch.setattr(bench_host, "MODES", host_modes.MODES)


def test_every_mode_measures_both_configurations_side_by_side(
        tmp_path: pathlib.Path, small_modes: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_host.main(["--rounds", "2", "--modes", "decode1,request1", "--out",
                            str(tmp_path), "--machine-label", "test box"]) == 0
    document = json.loads((tmp_path / "host.json").read_text())
    assert document["machine"]["label"] == "test box"
    for mode in ("decode1", "request1"):
        measured = document["modes"][mode]
        for name in ("canary", "all-checks"):
            rounds = measured["configs"][name]["rounds"]
            assert len(rounds) == 2 and all(figures["server_us"] > 0 for figures in rounds)
        assert measured["ratios"]["all-checks x canary"]["samples"] == 2
    text = (tmp_path / "host.txt").read_text()
    header = next(line for line in text.splitlines() if line.strip().startswith("mode"))
    assert header.split() == ["mode", "unit", "canary", "µs", "all-checks", "µs", "all-checks",
                              "x", "canary", "launches"]
    assert "test box" in text and text in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["decode64", "prefill"])
def test_the_large_modes_run_one_unit(mode: str, small_modes: None) -> None:
    run = host_modes.MODES[mode].start(config=_config("canary"), rounds=1)
    (cost,) = run.unit()
    assert cost.mode == ("DECODE" if mode == "decode64" else "EXTEND") and cost.server_us > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
