"""The self-check's hybrid sliding-window server (``SimulatedServer(sliding_window=)``): its
workload really slides windows (SGLang's allocator frees SWA slots behind them and hands them to
new tokens), prefix matches keep live windows, and a canary that checks no window slot fails the
window scenarios."""

import sys

import torch

from sglang.jit_kernel.kv_canary.consts import Reason
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.scenarios import run_scenario, swa_scenarios
from sglang.srt.kv_canary.selfcheck.simulation import default_server, run_mixed_workload
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")

_KERNELS = load_kernels(KernelBackend.TORCH_REFERENCE)


def test_the_workload_frees_and_reuses_swa_slots_behind_the_window() -> None:
    server = None

    def forward(batch):
        return server.runner.forward(batch)

    server = default_server(page_size=1, forward=forward, sliding_window=6)
    assert isinstance(server.kv_pool, SWAKVPool)
    allocator = server.allocator
    freed: list[torch.Tensor] = []
    original_free_swa = allocator.free_swa

    def free_swa(free_index: torch.Tensor) -> None:
        freed.append(allocator.full_to_swa_index_mapping[free_index].clone())
        original_free_swa(free_index)

    allocator.free_swa = free_swa
    run_mixed_workload(server)
    freed_slots = torch.cat(freed)
    assert freed_slots.numel() > 50  # windows slid
    live = allocator.full_to_swa_index_mapping[:-1]
    # SWA slots freed behind a window were handed to later tokens
    assert bool(torch.isin(freed_slots, live[live > 0]).any())


def test_a_canary_blind_to_window_slots_fails_the_window_scenario(monkeypatch) -> None:
    window_table = next(s for s in swa_scenarios() if "window_table" in s.name)
    assert window_table.must_detect == int(Reason.VERIFY_WINDOW_OWNER)
    assert run_scenario(window_table, page_size=1, kernels=_KERNELS).passed

    import sglang.jit_kernel.kv_canary.canary_forward_ref as reference
    from sglang.jit_kernel.kv_canary.torch_helpers import WindowSlots

    def no_window_slot_needed(state, slots, *, needed):
        nowhere = torch.zeros_like(needed)
        return WindowSlots(slots=torch.zeros_like(slots), needed=nowhere, live=nowhere)

    monkeypatch.setattr(reference, "window_slots", no_window_slot_needed)
    outcome = run_scenario(window_table, page_size=1, kernels=_KERNELS)
    assert not outcome.passed and "missed" in outcome.detail


if __name__ == "__main__":
    import pytest

    sys.exit(pytest.main([__file__, "-v"]))
