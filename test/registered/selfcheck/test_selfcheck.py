"""``python -m sglang.srt.kv_canary.selfcheck``: passes (exit 0, a PASS row per scenario) with the
real reference kernels, and fails (exit 1) when the canary's checks are broken: a self-check
that cannot fail proves nothing. Every scenario passes for page sizes 1 and 4, the persistent
scheduler/engine bugs each have their scenario, and the checks each bug relies on are the ones
that catch it."""

import dataclasses
import subprocess
import sys

import pytest

from sglang.jit_kernel.kv_canary.consts import COUNTER_VIOLATIONS, Reason
from sglang.srt.kv_canary.monitor.violations import parse_violation_line
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck import __main__ as selfcheck_main
from sglang.srt.kv_canary.selfcheck.bugs import KvBitFlip
from sglang.srt.kv_canary.selfcheck.scenarios import (
    Scenario,
    fault_caught,
    bug_scenarios,
    default_scenarios,
    fault_details,
    run_scenario,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=120, suite="kv-canary-cpu")

_SCENARIOS = {scenario.name: scenario for scenario in default_scenarios()}
_KERNELS = load_kernels(KernelBackend.TORCH_REFERENCE)
# The persistent bugs the self-check must catch: fault name -> the reason that must catch it.
_BUG_FAULTS = {
    "stale_slot_reuse": Reason.VERIFY_OWNER,
    "foreign_cached_prefix": Reason.VERIFY_OWNER,
    "prefix_rounded_up": Reason.VERIFY_OWNER,
    "sibling_mixed_pointer": Reason.VERIFY_OWNER,
    "sibling_shared_slot": Reason.VERIFY_OWNER,
    "seq_lens_drift": Reason.VERIFY_OWNER,
    "prefix_slot_zero": Reason.VERIFY_UNMAPPED,
    "write_slot_zero": Reason.WRITE_UNMAPPED,
    "last_forward_overwrite": Reason.VERIFY_OVERWRITTEN,
    "kv_bit_flip_v": Reason.VERIFY_REAL_KV,
    "kv_bit_flip_k": Reason.VERIFY_REAL_KV,
}
# (the host tier's stale load is one too, run with every check: test_host_tier_simulation.py)
_FOREIGN_HISTORIES = [
    name for name, scenario in _SCENARIOS.items()
    if scenario.bug is not None and scenario.must_detect == Reason.VERIFY_OWNER
    and not scenario.host_tier
]


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
    kernels = _KERNELS

    def blind(launch):
        def run(*, state, batch) -> None:
            violations = int(state.counters[COUNTER_VIOLATIONS])
            launch(state=state, batch=batch)
            state.counters[COUNTER_VIOLATIONS] = violations

        return run

    return dataclasses.replace(
        kernels, pre_forward=blind(kernels.pre_forward), post_forward=blind(kernels.post_forward)
    )


def _kernels_without_ownership() -> CanaryKernels:
    """Reference kernels whose ownership check never fires: every owner chain reads as unknown
    (0) in both launches, so each forward adopts the chain its records imply, and the deferred
    admission check (a new owner's first forward) does not run."""
    kernels = _KERNELS

    def unknown_owners(launch):
        def run(*, state, batch) -> None:
            state.owner_chains.zero_()
            launch(state=state, batch=batch)

        return run

    return dataclasses.replace(
        kernels,
        pre_forward=unknown_owners(kernels.pre_forward),
        post_forward=unknown_owners(kernels.post_forward),
        admission_owner_check=lambda **_: None,
    )


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("name", list(_SCENARIOS))
def test_every_scenario_passes(name: str, page_size: int) -> None:
    outcome = run_scenario(_SCENARIOS[name], page_size=page_size, kernels=_KERNELS)
    assert outcome.passed, outcome.detail
    if _SCENARIOS[name].bug is not None:
        assert outcome.faults >= 2, f"{name}: only {outcome.faults} fault(s) injected"


def test_every_persistent_bug_has_its_scenario() -> None:
    scenarios = bug_scenarios()
    by_fault: dict[str, list[Scenario]] = {}
    for scenario in scenarios:
        if scenario.bug is not None:
            by_fault.setdefault(scenario.bug.name, []).append(scenario)
    assert set(by_fault) == set(_BUG_FAULTS)
    for fault, reason in _BUG_FAULTS.items():
        detecting = [s for s in by_fault[fault] if not s.expect_silent_faults]
        assert detecting and all(s.must_detect == reason for s in detecting), fault
    for scenario in scenarios:
        assert scenario.name in _SCENARIOS and len(scenario.name) <= 48
    # the foreign histories: token checks and real data off, nothing but verify_owner allowed
    assert len(_FOREIGN_HISTORIES) == 6
    for name in _FOREIGN_HISTORIES:
        config = _SCENARIOS[name].config
        assert config.real_data.value == "none" and not config.token_history_enabled
        assert _SCENARIOS[name].allowed_reasons == Reason.VERIFY_OWNER
    # the bit flips: caught with real data all and partial, silent with none
    for fault in ("kv_bit_flip_v", "kv_bit_flip_k"):
        modes = {s.config.real_data.value: s for s in by_fault[fault]}
        assert set(modes) == {"all", "partial", "none"}
        assert modes["none"].expect_silent_faults and not modes["none"].may_report
    assert "clean run, real_data=none" in _SCENARIOS


@pytest.mark.parametrize("name", _FOREIGN_HISTORIES)
def test_the_ownership_check_alone_catches_the_foreign_histories(name: str) -> None:
    outcome = run_scenario(_SCENARIOS[name], page_size=4, kernels=_kernels_without_ownership())
    assert not outcome.passed
    assert outcome.faults > 0
    assert f"missed {outcome.faults}/{outcome.faults} faults" in outcome.detail


@pytest.mark.parametrize(
    "name",
    [
        "req_to_token fault",
        "real_kv_used fault, real_data=partial",
        "bug: slot 0 in a prefix",
        "bug: new token written to slot 0",
        "bug: prefix overwritten in last forward",
        "bug: last-layer K bit flip, real_data=all",
    ],
)
def test_a_blind_canary_misses_the_faults(name: str) -> None:
    outcome = run_scenario(_SCENARIOS[name], page_size=4, kernels=_blind_kernels())
    assert not outcome.passed
    assert outcome.faults > 0 and "missed" in outcome.detail


class _FlipOutsideThePartialWindow(KvBitFlip):
    """A V bit flip in the 16 bytes of the row that ``partial`` does not fold for the slot."""

    def flip_byte(self, *, slot: int, row_bytes: int, num_rows: int) -> int:
        inside = super().flip_byte(slot=slot, row_bytes=row_bytes, num_rows=num_rows)
        return (inside + 16) % row_bytes


@pytest.mark.parametrize("real_data, caught", [("all", True), ("partial", False)])
def test_partial_covers_only_its_window(real_data: str, caught: bool) -> None:
    """The simulated K/V rows are 32 bytes, two 16-byte windows: a flip in the other window is
    seen by ``all`` only (why the bit-flip scenarios flip inside the window)."""
    scenario = dataclasses.replace(
        _SCENARIOS[f"bug: last-layer V bit flip, real_data={real_data}"],
        bug=_FlipOutsideThePartialWindow,
    )
    outcome = run_scenario(scenario, page_size=1, kernels=_KERNELS)
    assert outcome.faults > 0
    assert outcome.passed is caught, outcome.detail


def test_a_bug_fault_is_caught_only_at_its_row_step_and_check() -> None:
    scenario = _SCENARIOS["bug: siblings given one new slot"]
    fault = PERTURB_LINE_RE.search(
        "kv_canary perturb: fault=sibling_shared_slot step=20 row=1 rid=req11 position=15 "
        "req_pool_idx=11,10 injected_step=20 partner_rid=req10 slot=123"
    )
    assert fault_details(fault=fault)["req_pool_idx"] == "11,10"

    def row(*, check: str = "post_verify", rp: int = 10, position: int = 15, step: int = 20):
        return parse_violation_line(
            f"kv_canary violation: check={check} reasons=verify_owner req_pool_idx={rp} slot=123 "
            f"position={position} stored_token=1 expected_token=-1 "
            f"stored_chain=0x0000000000000001 expected_chain=0x0000000000000002 step={step}"
        )

    def caught(**row_fields: object) -> bool:
        return fault_caught(scenario=scenario, fault=fault, rows=[row(**row_fields)])

    assert caught()
    assert caught(rp=11)
    assert not caught(rp=12)  # another request row
    assert not caught(position=14)
    assert not caught(step=19)  # before the victim read it
    assert not caught(step=21)  # later than the allowed delay
    assert not caught(check="pre_verify")  # not the detecting check


def test_a_stopped_kernel_is_caught_by_the_health_check_scenario() -> None:
    outcome = run_scenario(_SCENARIOS["canary path stopped mid-run"], page_size=1, kernels=_KERNELS)
    assert outcome.passed, outcome.detail


def test_main_exits_nonzero_when_a_scenario_fails(monkeypatch, capsys) -> None:
    monkeypatch.setattr(selfcheck_main, "load_kernels", lambda backend: _blind_kernels())
    assert selfcheck_main.main(["--page-sizes", "1"]) == 1
    output = capsys.readouterr().out
    assert "FAIL" in output and "FAILED" in output.splitlines()[-1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
