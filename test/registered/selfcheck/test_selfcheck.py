"""``python -m sglang.srt.kv_canary.selfcheck``: passes (exit 0, a PASS row per scenario) with the
real reference kernels, and fails (exit 1) when the canary's checks are broken: a self-check
that cannot fail proves nothing."""

import dataclasses
import subprocess
import sys

import pytest

from sglang.jit_kernel.kv_canary.consts import COUNTER_KERNEL_RUNS, COUNTER_VIOLATIONS, CheckKind
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck import __main__ as selfcheck_main
from sglang.srt.kv_canary.selfcheck.scenarios import default_scenarios, run_scenario
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="kv-canary-cpu")

_SCENARIOS = {scenario.name: scenario for scenario in default_scenarios()}


def test_selfcheck_passes_as_a_program() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sglang.srt.kv_canary.selfcheck"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if " PASS " in line]
    assert len(rows) == 2 * len(_SCENARIOS)  # page sizes 1 and 4
    assert "FAIL" not in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("all passed")


def _blind_kernels() -> CanaryKernels:
    """Reference kernels that run and write records but throw every verdict away."""
    kernels = load_kernels(KernelBackend.TORCH_REFERENCE)

    def pre_forward_verify(*, state, batch) -> None:
        state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] += 1

    def post_forward_write_and_verify(*, state, batch) -> None:
        violations = int(state.counters[COUNTER_VIOLATIONS])
        kernels.post_forward_write_and_verify(state=state, batch=batch)
        state.counters[COUNTER_VIOLATIONS] = violations

    return dataclasses.replace(kernels, pre_forward_verify=pre_forward_verify,
                               post_forward_write_and_verify=post_forward_write_and_verify)


@pytest.mark.parametrize("name", ["req_to_token fault", "real_kv_used fault, real_data=partial"])
def test_a_blind_canary_misses_the_faults(name: str) -> None:
    outcome = run_scenario(_SCENARIOS[name], page_size=4, kernels=_blind_kernels())
    assert not outcome.passed
    assert outcome.faults > 0 and "missed" in outcome.detail


def test_a_stopped_kernel_is_caught_by_the_health_check_scenario() -> None:
    kernels = load_kernels(KernelBackend.TORCH_REFERENCE)
    outcome = run_scenario(_SCENARIOS["canary path stopped mid-run"], page_size=1, kernels=kernels)
    assert outcome.passed, outcome.detail


def test_main_exits_nonzero_when_a_scenario_fails(monkeypatch, capsys) -> None:
    monkeypatch.setattr(selfcheck_main, "load_kernels", lambda backend: _blind_kernels())
    assert selfcheck_main.main(["--page-sizes", "1"]) == 1
    output = capsys.readouterr().out
    assert "FAIL" in output and "FAILED" in output.splitlines()[-1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
