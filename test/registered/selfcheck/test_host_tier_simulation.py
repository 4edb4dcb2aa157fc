"""The self-check's host tier (``SimulatedServer(host_slots=)``, ``run_host_tier_workload``): the
simulated host pool copies whole pages by index as SGLang's ``MHATokenToKVPoolHost`` does, the
workload really loads prefixes back into other pages after those were overwritten, every
host-tier scenario passes at page sizes 1 and 4, and a canary whose host tier (or whose checks)
does less than it must fails them: the scenarios cannot pass without the records following the
pages."""

import dataclasses
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import COUNTER_VIOLATIONS, FIELD_FINGERPRINT, Reason
from sglang.jit_kernel.kv_canary.hashing import slot_fingerprints_torch
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode
from sglang.srt.kv_canary.hooks.host_tier import after_backup, before_load_layer
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.monitor.violations import find_violation_rows
from sglang.srt.kv_canary.runner.host_tier import HostTierRecords
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck import scenarios as selfcheck
from sglang.srt.kv_canary.selfcheck.scenarios import (
    Scenario,
    attach_simulated_host_tier,
    default_scenarios,
    host_tier_scenarios,
    install_canary_runner,
    run_scenario,
    server_hooks,
)
from sglang.srt.kv_canary.selfcheck.simulation import (
    SimulatedHostPool,
    SimulatedModelRunner,
    SimulatedPool,
    default_server,
    run_host_tier_workload,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="kv-canary-cpu")

_KERNELS = load_kernels(KernelBackend.TORCH_REFERENCE)
_SCENARIOS = {scenario.name: scenario for scenario in host_tier_scenarios()}
_CLEAN_PARTIAL = "host tier: clean run, real_data=partial"
_CLEAN_NONE = "host tier: clean run, real_data=none"
# host-tier bug -> the reason that must catch it
_HOST_BUGS = {
    "load_shifted_page": Reason.VERIFY_POSITION,
    "host_copy_flip": Reason.VERIFY_REAL_KV,
    "stale_host_load": Reason.VERIFY_OWNER,
}


def _mha_pool(*, page_size: int, size: int = 32) -> MHATokenToKVPool:
    return MHATokenToKVPool(size, page_size=page_size, dtype=torch.bfloat16, head_num=3,
                            head_dim=8, layer_num=2, device="cpu", enable_memory_saver=False,
                            enable_alt_stream=False)


def test_the_host_pool_copies_whole_pages_by_index() -> None:
    device = _mha_pool(page_size=4)
    host = SimulatedHostPool(device_pool=device, size=16)
    assert host.layout == "layer_first" and host.available_size() == 16
    assert tuple(host.k_data_refs[1].shape) == (16, 3, 8)
    first = host.alloc(8)
    assert first.tolist() == list(range(8))  # host slot 0 is a slot like any other
    assert host.alloc(12) is None and host.available_size() == 8
    with pytest.raises(ValueError, match="page-aligned"):
        host.alloc(2)
    for layer in range(2):
        device.k_buffer[layer][4:12] = torch.arange(8 * 24).view(8, 3, 8).to(torch.bfloat16)
        device.v_buffer[layer][4:12] = -device.k_buffer[layer][4:12]
    device_slots = torch.arange(4, 12)
    host.backup_from_device_all_layer(device, first, device_slots, "kernel")
    for layer in range(2):  # a load into other slots, layer by layer
        host.load_to_device_per_layer(device, first, torch.arange(20, 28), layer, "kernel")
        assert torch.equal(device.k_buffer[layer][20:28], device.k_buffer[layer][4:12])
        assert torch.equal(device.v_buffer[layer][20:28], device.v_buffer[layer][4:12])
    host.free(first[4:])  # the second page freed goes back last
    assert host.alloc(12).tolist() == list(range(8, 16)) + list(range(4, 8))
    with pytest.raises(ValueError, match="whole pages"):
        host.free(torch.tensor([1, 2, 3, 4]))
    mla = MLATokenToKVPool(32, page_size=1, dtype=torch.bfloat16, kv_lora_rank=32,
                           qk_rope_head_dim=16, layer_num=2, device="cpu",
                           enable_memory_saver=False)
    with pytest.raises(ValueError, match="no host pool"):
        SimulatedHostPool(device_pool=mla, size=8)


def test_the_host_copies_call_the_hook_tables_adapters() -> None:
    hooks = server_hooks(CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL))
    assert hooks.backup == (after_backup,)
    assert hooks.load_layer == (before_load_layer,)
    with pytest.raises(ValueError, match="no host pool"):
        default_server(page_size=1, forward=lambda batch: None, kv_pool=SimulatedPool.MLA,
                       host_tier=True)


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_workload_loads_overwritten_prefixes_back_into_other_pages(page_size: int) -> None:
    """The records follow every copy (the adapters reach the tier through the host pool) and
    the loads read pages that other requests reallocated and overwrote in between; the host
    pool fills up and drops copies; the clean run reports nothing."""
    config = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL,
                          ring_capacity=4096)
    server = default_server(
        page_size=page_size, hooks=server_hooks(config), host_tier=True,
        forward=lambda batch: around_forward(SimulatedModelRunner.forward, server.runner, batch),
    )
    loaded_tokens = []
    original_load = server.host_pool.load_to_device_per_layer

    def load(device_pool, host_indices, device_indices, layer_id, io_backend):
        if layer_id == 0:
            loaded_tokens.append(int(device_indices.shape[0]))
        original_load(device_pool, host_indices, device_indices, layer_id, io_backend)

    server.host_pool.load_to_device_per_layer = load
    with selfcheck._LogCapture() as capture:
        runner = install_canary_runner(model_runner=server.runner, config=config,
                                       kernels=_KERNELS)
        tier = attach_simulated_host_tier(runner=runner, host_pool=server.host_pool)
        run_host_tier_workload(server)
        runner.on_idle()
    assert not find_violation_rows("\n".join(capture.lines))
    assert server.loads == len(loaded_tokens) >= 15
    assert server.moved_loads >= 10 and server.overwritten_loads >= 10
    assert tier.loaded_slots == sum(loaded_tokens) and not tier.busy
    assert tier.backed_up_slots > server.host_pool.size  # host copies were dropped for new ones
    assert server.backups >= 20


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("name", list(_SCENARIOS))
def test_every_host_tier_scenario_passes(name: str, page_size: int) -> None:
    scenario = _SCENARIOS[name]
    outcome = run_scenario(scenario, page_size=page_size, kernels=_KERNELS)
    assert outcome.passed, outcome.detail
    assert outcome.loads >= 15
    if scenario.bug is not None:
        assert outcome.faults >= 2, f"{name}: only {outcome.faults} fault(s) injected"


def test_the_host_tier_scenarios_are_in_the_self_check_list() -> None:
    listed = {scenario.name for scenario in default_scenarios()}
    assert set(_SCENARIOS) <= listed
    assert all(scenario.host_tier for scenario in _SCENARIOS.values())
    by_fault: dict[str, list[Scenario]] = {}
    for scenario in _SCENARIOS.values():
        if scenario.bug is not None:
            by_fault.setdefault(scenario.bug.name, []).append(scenario)
    assert set(by_fault) == set(_HOST_BUGS)
    for fault, reason in _HOST_BUGS.items():
        detecting = [s for s in by_fault[fault] if not s.expect_silent_faults]
        assert detecting and all(s.must_detect == reason for s in detecting), fault
        assert all(s.max_detection_delay == 0 and s.detecting_checks for s in detecting)
    flips = {s.config.real_data.value: s for s in by_fault["host_copy_flip"]}
    assert set(flips) == {"all", "partial", "none"}
    assert flips["none"].expect_silent_faults and not flips["none"].may_report
    clean = [s for s in _SCENARIOS.values() if s.bug is None]
    assert {s.config.real_data.value for s in clean} == {"partial", "all", "none"}
    assert any(s.config.enable_write_input_assert and s.config.enable_token_oracle
               for s in clean)


def _blind_kernels() -> CanaryKernels:
    """Reference kernels that run and write records but throw every verdict away."""

    def blind(launch):
        def run(*, state, batch) -> None:
            violations = int(state.counters[COUNTER_VIOLATIONS])
            launch(state=state, batch=batch)
            state.counters[COUNTER_VIOLATIONS] = violations

        return run

    return dataclasses.replace(_KERNELS, pre_forward=blind(_KERNELS.pre_forward),
                               post_forward=blind(_KERNELS.post_forward),
                               admission_owner_check=lambda **_: None)


def _rekey_without_complement(*, state, loaded) -> None:
    """A re-key that stores the loaded bytes' fingerprint without checking them first."""
    real_data = state.real_data
    if real_data is not None and loaded.count:
        state.records[loaded.slots, FIELD_FINGERPRINT] = slot_fingerprints_torch(
            slots=loaded.slots, sources=real_data.sources, partial=real_data.partial
        )


@pytest.mark.parametrize("page_size", [1, 4])
def test_without_the_rekey_the_partial_clean_run_fails(page_size: int) -> None:
    """A loaded page mostly lands on slots whose ``partial`` windows differ from its origin's:
    kept as restored, its fingerprints no longer verify."""
    kernels = dataclasses.replace(_KERNELS, rekey_loaded=lambda **_: None)
    outcome = run_scenario(_SCENARIOS[_CLEAN_PARTIAL], page_size=page_size, kernels=kernels)
    assert not outcome.passed and "verify_real_kv_hash" in outcome.detail


@pytest.mark.parametrize("missing", ["on_backup", "on_load_started"])
def test_a_tier_that_misses_the_copies_fails_the_clean_run(monkeypatch, missing: str) -> None:
    """Without the backup's records (or the load's restore) the loaded slots keep the records
    of whatever overwrote them: the clean run reports them."""
    monkeypatch.setattr(HostTierRecords, missing, lambda self, **_: None)
    outcome = run_scenario(_SCENARIOS[_CLEAN_NONE], page_size=4, kernels=_KERNELS)
    assert not outcome.passed and "violation(s) in a silent run" in outcome.detail


@pytest.mark.parametrize("real_data", ["all", "partial"])
def test_a_rekey_that_never_complements_misses_the_flipped_copies(real_data: str) -> None:
    kernels = dataclasses.replace(_KERNELS, rekey_loaded=_rekey_without_complement)
    scenario = _SCENARIOS[f"host tier bug: host copy flipped, real_data={real_data}"]
    outcome = run_scenario(scenario, page_size=1, kernels=kernels)
    assert outcome.faults > 0
    assert not outcome.passed and f"missed {outcome.faults}/{outcome.faults}" in outcome.detail


def test_the_ownership_check_catches_the_stale_loads() -> None:
    """Another prompt's records are consistent from position 0: with every owner chain unknown
    (each forward adopts the chain its records imply) and no admission check, the stale loads
    are missed, though the token rows still show."""
    kernels = _KERNELS

    def unknown_owners(launch):
        def run(*, state, batch) -> None:
            state.owner_chains.zero_()
            launch(state=state, batch=batch)

        return run

    kernels = dataclasses.replace(
        kernels, pre_forward=unknown_owners(kernels.pre_forward),
        post_forward=unknown_owners(kernels.post_forward), admission_owner_check=lambda **_: None,
    )
    outcome = run_scenario(_SCENARIOS["host tier bug: stale host slots loaded"], page_size=4,
                           kernels=kernels)
    assert outcome.faults > 0
    assert f"missed {outcome.faults}/{outcome.faults} faults" in outcome.detail


@pytest.mark.parametrize(
    "name",
    [
        "host tier bug: load shifted by a page",
        "host tier bug: host copy flipped, real_data=partial",
        "host tier bug: stale host slots loaded",
    ],
)
def test_a_blind_canary_misses_the_host_tier_bugs(name: str) -> None:
    outcome = run_scenario(_SCENARIOS[name], page_size=4, kernels=_blind_kernels())
    assert outcome.faults > 0
    assert not outcome.passed and "missed" in outcome.detail


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
