"""The self-check's token-check scenarios pass with the reference kernels, and fail when the
check they rely on is taken away: a blind canary, no write-input expectations, neither the
prompt tokens sent with the batch nor the history fallback (a self-check that cannot fail proves
nothing)."""

import dataclasses
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import COUNTER_VIOLATIONS
from sglang.srt.kv_canary.runner.token_checks import TokenChecks
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.scenarios import default_scenarios, run_scenario
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")

_SCENARIOS = {scenario.name: scenario for scenario in default_scenarios()}
_TOKEN_SCENARIOS = [
    "clean run, verify_token + write_input",
    "clean run, verify_token, real sampler",
    "input_ids fault, token checks",
    "input_ids fault, token checks off",
    "foreign next token, token checks",
]
_KERNELS = load_kernels(KernelBackend.TORCH_REFERENCE)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("name", _TOKEN_SCENARIOS)
def test_token_check_scenarios_pass(name: str, page_size: int) -> None:
    outcome = run_scenario(_SCENARIOS[name], page_size=page_size, kernels=_KERNELS)
    assert outcome.passed, outcome.detail
    if "fault" in name or "foreign" in name:
        assert outcome.faults > 0


def _blind_kernels() -> CanaryKernels:
    """Reference kernels that write records but throw every verdict away."""

    def pre_forward(*, state, batch) -> None:
        violations = int(state.counters[COUNTER_VIOLATIONS])
        _KERNELS.pre_forward(state=state, batch=batch)
        state.counters[COUNTER_VIOLATIONS] = violations

    def post_forward(*, state, batch) -> None:
        violations = int(state.counters[COUNTER_VIOLATIONS])
        _KERNELS.post_forward(state=state, batch=batch)
        state.counters[COUNTER_VIOLATIONS] = violations

    return dataclasses.replace(_KERNELS, pre_forward=pre_forward, post_forward=post_forward)


@pytest.mark.parametrize("name", ["input_ids fault, token checks",
                                  "foreign next token, token checks"])
def test_a_blind_canary_misses_the_token_faults(name: str) -> None:
    outcome = run_scenario(_SCENARIOS[name], page_size=4, kernels=_blind_kernels())
    assert not outcome.passed and "missed" in outcome.detail


def _kernels_without(*fields: str) -> CanaryKernels:
    """Reference kernels whose launches (both: a DECODE layout's inputs are checked before the
    model, an EXTEND layout's after it) see the batch view without ``fields``."""
    cleared = dict.fromkeys(fields)

    def pre_forward(*, state, batch) -> None:
        _KERNELS.pre_forward(state=state, batch=dataclasses.replace(batch, **cleared))

    def post_forward(*, state, batch) -> None:
        _KERNELS.post_forward(state=state, batch=dataclasses.replace(batch, **cleared))

    return dataclasses.replace(_KERNELS, pre_forward=pre_forward, post_forward=post_forward)


def test_without_write_input_expectations_a_foreign_token_goes_unnoticed() -> None:
    """Launches that see no expectations: a token the oracle did not emit is then only ever
    compared with the history, which has it too."""
    kernels = _kernels_without("expected_input_ids", "expected_positions")
    outcome = run_scenario(_SCENARIOS["foreign next token, token checks"], page_size=1,
                           kernels=kernels)
    assert not outcome.passed and "missed" in outcome.detail


def _kernels_writing_without_history() -> CanaryKernels:
    """Reference kernels that see no token history."""
    return _kernels_without("token_history", "token_history_lens")


def test_prompt_token_faults_are_caught_from_the_tokens_sent_with_the_batch() -> None:
    """The post launch compares an extend's prompt tokens with the request's tokens sent with the
    batch, so every fault is caught by a write_token row without any token history (and so
    without the verify_token rows the scenario also asks for)."""
    scenario = dataclasses.replace(_SCENARIOS["input_ids fault, token checks"],
                                   must_also_report=0)
    outcome = run_scenario(scenario, page_size=4, kernels=_kernels_writing_without_history())
    assert outcome.passed, outcome.detail


def test_without_the_prompt_tokens_and_the_history_prompt_token_faults_are_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Take both sources of a prompt token's expectation away (the tokens sent with the batch,
    the history fallback): an input_ids fault on a prompt token (which the oracle does not
    predict) is then not reported in its own forward."""
    original = TokenChecks.post_expectations

    def no_prompt_tokens(self, forward_batch, **kwargs):
        expected = original(self, forward_batch, **kwargs)
        if expected is None:
            return None
        tokens, positions = expected
        return torch.full_like(tokens, -1), positions  # no token expectation (positions stay)

    monkeypatch.setattr(TokenChecks, "post_expectations", no_prompt_tokens)
    outcome = run_scenario(_SCENARIOS["input_ids fault, token checks"], page_size=4,
                           kernels=_kernels_writing_without_history())
    assert not outcome.passed and "missed" in outcome.detail


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
