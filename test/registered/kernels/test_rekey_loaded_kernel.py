"""The load-back re-key launch, on the torch reference and the Triton kernel.

A slot loaded back from the host tier holds a copy of another slot's bytes and that slot's
record; the re-key checks the bytes against the restored fingerprint with the windows the
origin slot placed, and stores the fingerprint the slot's own windows give (its complement when
the bytes changed). Expectations come from the scalar hashing, independently of both
implementations.
"""

import sys

import pytest
import torch

from _canary_sim import IMPLS, TRITON_DEVICES, prefilled, rekey_impl
from sglang.jit_kernel.kv_canary.consts import FIELD_FINGERPRINT
from sglang.jit_kernel.kv_canary.hashing import to_signed_i64
from sglang.jit_kernel.kv_canary.kernel_inputs import LoadedSlots
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")
register_cuda_ci(est_time=20, suite="kv-canary-gpu")

TOKENS = [31, 32, 33, 34, 35, 36, 37, 38]


def _loaded_copy(sim, *, origins: list[int], targets: list[int]) -> LoadedSlots:
    """Copy each origin slot's bytes and record into its target slot, as a host-tier backup
    and load-back do."""
    for origin, target in zip(origins, targets):
        for buffer in sim.kv_buffers:
            buffer[target] = buffer[origin]
        sim.state.records[target] = sim.state.records[origin]
    return LoadedSlots(
        slots=torch.tensor(targets, dtype=torch.int64, device=sim.device),
        origins=torch.tensor(origins, dtype=torch.int64, device=sim.device),
    )


def _free_slots(sim, count: int) -> list[int]:
    return [page * sim.page_size for page in sim.free_pages[:count]]


@pytest.mark.parametrize("impl, device", IMPLS)
@pytest.mark.parametrize("real_data, num_sources", [("partial", 2), ("partial", 4), ("all", 3)])
def test_intact_copies_get_their_own_fingerprint(impl, device, real_data, num_sources):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS, len(TOKENS))], real_data=real_data,
                       num_sources=num_sources)
    origins = list(sim.requests[1].slots)
    targets = _free_slots(sim, len(origins))
    loaded = _loaded_copy(sim, origins=origins, targets=targets)
    rekey_impl(impl).launch_rekey_loaded(state=sim.state, loaded=loaded)
    sim.assert_guards_intact()
    for origin, target in zip(origins, targets):
        record = sim.record(target)
        assert record.fingerprint == sim.fingerprint(target), f"slot {target} from {origin}"
        assert record[:2] == sim.record(origin)[:2]


@pytest.mark.parametrize("impl, device", IMPLS)
@pytest.mark.parametrize("real_data", ["partial", "all"])
def test_a_byte_changed_in_the_origin_window_complements_the_fingerprint(impl, device,
                                                                        real_data):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS, len(TOKENS))], real_data=real_data)
    origins = list(sim.requests[1].slots)
    targets = _free_slots(sim, len(origins))
    loaded = _loaded_copy(sim, origins=origins, targets=targets)
    # one byte of the second copy, inside the first source's window as the origin placed it
    words = sim.sources[0]
    column = 2 * (origins[1] % (words.shape[1] // 2)) if real_data == "partial" else 0
    words[targets[1], column] ^= 1 << 12
    rekey_impl(impl).launch_rekey_loaded(state=sim.state, loaded=loaded)
    for index, target in enumerate(targets):
        live = sim.fingerprint(target)
        expected = to_signed_i64(~live) if index == 1 else live
        assert sim.record(target).fingerprint == expected, f"slot {target}"


@pytest.mark.parametrize("impl, device", IMPLS)
def test_slots_outside_the_pool_and_no_real_data_change_nothing(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS, 4)], real_data="partial")
    before = sim.state.records.clone()
    loaded = LoadedSlots(
        slots=torch.tensor([0, -3, sim.num_slots], dtype=torch.int64, device=sim.device),
        origins=torch.tensor([1, 2, 3], dtype=torch.int64, device=sim.device),
    )
    rekey_impl(impl).launch_rekey_loaded(state=sim.state, loaded=loaded)
    assert torch.equal(sim.state.records, before)
    plain, _ = prefilled(impl, device, prompts=[(TOKENS, 4)], real_data="none")
    before = plain.state.records.clone()
    rekey_impl(impl).launch_rekey_loaded(state=plain.state, loaded=_loaded_copy(
        plain, origins=list(plain.requests[1].slots), targets=_free_slots(plain, 4)))
    after_copy = plain.state.records.clone()
    assert torch.equal(after_copy[:, FIELD_FINGERPRINT], before[:, FIELD_FINGERPRINT])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_equals_the_reference_on_random_loads(device, seed):
    generator = torch.Generator().manual_seed(seed)
    results = []
    for impl in ("reference", "triton"):
        sim, _ = prefilled("reference", device, prompts=[(TOKENS, len(TOKENS))],
                           real_data="partial", num_sources=4, seed=seed)
        count = 24
        slots = torch.randint(1, sim.num_slots, (count,), generator=generator)
        origins = torch.randint(0, sim.num_slots, (count,), generator=generator)
        generator.manual_seed(seed)  # the same draws for both implementations
        sim.state.records[:, FIELD_FINGERPRINT] = torch.randint(
            -(2**62), 2**62, (sim.num_slots,), generator=torch.Generator().manual_seed(seed)
        ).to(sim.device)
        loaded = LoadedSlots(slots=slots.unique().to(sim.device),
                             origins=origins[: slots.unique().numel()].to(sim.device))
        rekey_impl(impl).launch_rekey_loaded(state=sim.state, loaded=loaded)
        results.append(sim.state.records.cpu())
    assert torch.equal(results[0], results[1])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
