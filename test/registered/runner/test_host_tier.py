"""The host tier's records (``--enable-hierarchical-cache``) on a CPU, with SGLang's own MHA pool
and the torch reference of the re-key: records follow slots to host slots and back into new
device slots, fingerprints are re-keyed for the new slots, and changed bytes are marked."""

import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import FIELD_FINGERPRINT, RECORD_FIELDS
from sglang.jit_kernel.kv_canary.torch_helpers import fingerprints
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode
from sglang.srt.kv_canary.hooks.host_tier import (
    HOST_TIER_ATTRIBUTE,
    after_backup,
    before_load_layer,
)
from sglang.srt.kv_canary.pools import canary_pool_for
from sglang.srt.kv_canary.pools.seam import PoolContext
from sglang.srt.kv_canary.runner.device_state import allocate_device_state
from sglang.srt.kv_canary.runner.host_tier import HostTierRecords, host_record_bytes_per_token
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

_SLOTS = 32


def _tier(real_data: RealDataMode = RealDataMode.PARTIAL):
    """(tier, state, kv pool): 32 slots of 2 layers x 2 heads x 16 bf16 values, random bytes,
    and each slot's record holding a recognizable value and its bytes' fingerprint."""
    kv_pool = MHATokenToKVPool(_SLOTS, page_size=1, dtype=torch.bfloat16, head_num=2,
                               head_dim=16, layer_num=2, device="cpu",
                               enable_memory_saver=False, enable_alt_stream=False)
    generator = torch.Generator().manual_seed(0)
    for buffer in (*kv_pool.k_buffer, *kv_pool.v_buffer):
        buffer.copy_(torch.randn(buffer.shape, generator=generator).to(buffer.dtype))
    req_pool = ReqToTokenPool(size=4, max_context_len=16, device="cpu", enable_memory_saver=False)
    pool = canary_pool_for(req_to_token_pool=req_pool, token_to_kv_pool=kv_pool,
                           context=PoolContext())
    state = allocate_device_state(config=CanaryConfig(mode=CanaryMode.LOG, real_data=real_data),
                                  pool=pool, req_to_token=req_pool.req_to_token)
    slots = torch.arange(state.num_slots)
    state.records[:, 0] = slots * 1000
    state.records[:, 1] = slots * 7
    if state.real_data is not None:
        state.records[:, FIELD_FINGERPRINT] = fingerprints(state, slots)
    state.records[:, 3] = 5
    tier = HostTierRecords(state=state, num_host_slots=64,
                           rekey=load_kernels(KernelBackend.TORCH_REFERENCE).rekey_loaded)
    return tier, state, kv_pool


def _copy_kv(kv_pool, *, sources: list[int], targets: list[int]) -> None:
    for buffer in (*kv_pool.k_buffer, *kv_pool.v_buffer):
        buffer[targets] = buffer[sources]


def _i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_records_follow_a_backup_and_a_load_into_new_slots() -> None:
    tier, state, kv_pool = _tier()
    origins, host, targets = [3, 4, 5, 6], [10, 11, 12, 13], [20, 21, 22, 23]
    before = state.records[origins].clone()
    tier.on_backup(host_slots=_i64(host), device_slots=_i64(origins))
    assert torch.equal(tier.host_records[host], before)
    assert tier.host_origins[host].tolist() == origins
    state.records[origins] = 0  # the device slots are reused by other requests
    _copy_kv(kv_pool, sources=origins, targets=targets)
    tier.on_load_started(host_slots=_i64(host), device_slots=_i64(targets))
    assert tier.busy and state.records[targets[0], 0] != before[0, 0]
    tier.restore_started()
    assert torch.equal(state.records[targets][:, :2], before[:, :2]) and tier.busy
    tier.rekey_restored()
    assert not tier.busy and (tier.backed_up_slots, tier.loaded_slots) == (4, 4)
    assert torch.equal(state.records[targets, FIELD_FINGERPRINT],
                       fingerprints(state, _i64(targets)))
    assert torch.equal(state.records[targets, 3], before[:, 3])


@pytest.mark.parametrize("real_data", [RealDataMode.PARTIAL, RealDataMode.ALL])
def test_a_loaded_slot_whose_bytes_changed_gets_a_fingerprint_that_cannot_verify(
    real_data: RealDataMode,
) -> None:
    tier, state, kv_pool = _tier(real_data)
    tier.on_backup(host_slots=_i64([0, 1]), device_slots=_i64([7, 8]))
    _copy_kv(kv_pool, sources=[7, 8], targets=[17, 26])
    # every 16-byte window of layer 0's K row of the second copy, as the real_kv_host fault does
    kv_pool.k_buffer[0][26].view(-1).view(torch.uint8)[::16] ^= 0x5A
    tier.on_load_started(host_slots=_i64([0, 1]), device_slots=_i64([17, 26]))
    tier.restore_started()
    tier.rekey_restored()
    live = fingerprints(state, _i64([17, 26]))
    assert state.records[17, FIELD_FINGERPRINT] == live[0]
    assert state.records[26, FIELD_FINGERPRINT] == ~live[1]


def test_without_real_data_the_records_move_and_nothing_is_re_keyed() -> None:
    calls = []
    tier, state, _ = _tier(RealDataMode.NONE)
    tier = HostTierRecords(state=state, num_host_slots=8,
                           rekey=lambda **kwargs: calls.append(kwargs))
    tier.on_backup(host_slots=_i64([2]), device_slots=_i64([9]))
    tier.on_load_started(host_slots=_i64([2]), device_slots=_i64([30]))
    tier.restore_started()
    tier.rekey_restored()
    assert state.records[30].tolist() == state.records[9].tolist() and calls == []


def test_the_hooks_find_the_tier_on_sglangs_host_pool_and_capture_layer_0_only() -> None:
    tier, state, _ = _tier()
    host_pool = type("MHATokenToKVPoolHost", (), {})()
    setattr(host_pool, HOST_TIER_ATTRIBUTE, tier)
    after_backup(None, host_pool, object(), _i64([5]), _i64([2]), "kernel")
    assert tier.host_records[5].tolist() == state.records[2].tolist()
    before_load_layer(host_pool, object(), _i64([5]), _i64([29]), 1, "kernel")
    assert not tier.busy
    before_load_layer(host_pool, object(), _i64([5]), _i64([29]), 0, "kernel")
    assert tier.busy
    with pytest.raises(RuntimeError, match="host KV pool MLATokenToKVPoolHost has no canary"):
        after_backup(None, type("MLATokenToKVPoolHost", (), {})(), object(), _i64([1]),
                     _i64([1]), "kernel")


def test_mismatched_indices_are_refused_with_their_shapes() -> None:
    tier, _, _ = _tier()
    with pytest.raises(ValueError, match=r"got \(2,\) and \(3,\)"):
        tier.on_backup(host_slots=_i64([1, 2]), device_slots=_i64([1, 2, 3]))


def test_the_host_tier_is_budgeted_per_device_token_at_the_host_ratio() -> None:
    assert RECORD_FIELDS * 8 + 8 == 40
    assert host_record_bytes_per_token(hicache_ratio=4) == 160
    assert host_record_bytes_per_token(hicache_ratio=2.5) == 100
    assert host_record_bytes_per_token(hicache_ratio=1.01) == 41


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
