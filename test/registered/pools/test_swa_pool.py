"""The hybrid sliding-window pool through the seam: SGLang's own ``SWAKVPool`` and
``SWATokenToKVPoolAllocator`` on the CPU. Records per full slot, window slots through the
allocator's mapping (the same tensor, never a copy), real data from both sub-pools, the sweep
over ``SWARadixCache``, the memory added to the hybrid configurator's cell, and the real-data
faults aimed at either sub-pool."""

import random
import sys
from types import SimpleNamespace

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, KvSubPool, RealDataMode
from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.hooks.model_runner import add_canary_bytes_to_swa_cell_size
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.pools import canary_pool_for, hybrid_swa_token_bytes, pool_refusals
from sglang.srt.kv_canary.pools.mha import MHACanaryPool
from sglang.srt.kv_canary.pools.seam import PoolContext
from sglang.srt.kv_canary.pools.swa import WINDOW_OWNER_BYTES, SWACanaryPool
from sglang.srt.kv_canary.runner.device_state import allocate_device_state
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

WINDOW = 6


def _pools(*, page_size: int = 1, size: int = 32, size_swa: int = 16):
    pool = SWAKVPool(size=size, size_swa=size_swa, page_size=page_size, dtype=torch.bfloat16,
                     head_num=1, head_dim=8, swa_attention_layer_ids=[0, 2],
                     full_attention_layer_ids=[1, 3], enable_kvcache_transpose=False,
                     device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    allocator = SWATokenToKVPoolAllocator(size=size, size_swa=size_swa, page_size=page_size,
                                          dtype=torch.bfloat16, device="cpu", kvcache=pool,
                                          need_sort=False)
    req_pool = ReqToTokenPool(size=4, max_context_len=16, device="cpu", enable_memory_saver=False)
    return pool, allocator, req_pool


def _canary_pool(pool, req_pool) -> SWACanaryPool:
    return canary_pool_for(req_to_token_pool=req_pool, token_to_kv_pool=pool,
                           context=PoolContext(sliding_window_size=WINDOW))


@pytest.mark.parametrize("page_size", [1, 4])
def test_records_follow_the_full_pool_and_window_slots_the_allocator_s_mapping(page_size) -> None:
    pool, allocator, req_pool = _pools(page_size=page_size)
    assert pool_refusals(req_to_token_pool=req_pool, token_to_kv_pool=pool) == []
    canary = _canary_pool(pool, req_pool)
    assert isinstance(canary, SWACanaryPool)
    assert canary.num_record_slots == 32 + page_size
    spec = canary.window_spec()
    assert spec.slot_table is allocator.full_to_swa_index_mapping  # the live mapping
    assert spec.num_window_slots == 16 + page_size and spec.window == WINDOW
    names = [(b.name, b.windowed) for b in canary.fingerprint_buffers()]
    assert names == [("full layer 0 K", False), ("full layer 1 V", False),
                     ("swa layer 0 K", True), ("swa layer 1 V", True)]
    assert "window slots" in canary.describe() and f"window {WINDOW}" in canary.describe()


def test_the_device_state_gets_an_owner_table_and_the_windowed_sources() -> None:
    pool, allocator, req_pool = _pools()
    config = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL)
    state = allocate_device_state(config=config, pool=_canary_pool(pool, req_pool),
                                  req_to_token=req_pool.req_to_token)
    assert state.records.shape[0] == 33
    assert state.window.owners.shape == (17,) and not state.window.owners.any()
    assert state.window.windowed_sources == 0b1100 and state.window.window == WINDOW
    assert state.window.slot_table is allocator.full_to_swa_index_mapping


def test_a_hybrid_pool_without_a_window_or_a_mapping_is_refused() -> None:
    pool, _, req_pool = _pools()
    with pytest.raises(CanaryUnsupportedError, match="no sliding_window_size"):
        canary_pool_for(req_to_token_pool=req_pool, token_to_kv_pool=pool,
                        context=PoolContext())
    bare = SWAKVPool(size=8, size_swa=8, page_size=1, dtype=torch.bfloat16, head_num=1,
                     head_dim=8, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                     enable_kvcache_transpose=False, device="cpu", enable_memory_saver=False,
                     enable_alt_stream=False)
    with pytest.raises(CanaryUnsupportedError, match="full_to_swa_index_mapping"):
        canary_pool_for(req_to_token_pool=req_pool, token_to_kv_pool=bare,
                        context=PoolContext(sliding_window_size=WINDOW))


def test_an_all_sliding_window_pool_is_refused_with_the_reason() -> None:
    pool = object.__new__(SWAKVPool)
    pool.full_kv_pool = SimpleNamespace(k_buffer=[])
    pool.swa_kv_pool = SimpleNamespace(k_buffer=[torch.zeros(2, 1)])
    (reason,) = pool_refusals(
        req_to_token_pool=ReqToTokenPool(size=2, max_context_len=4, device="cpu",
                                         enable_memory_saver=False),
        token_to_kv_pool=pool,
    )
    assert "SWAKVPool" in reason and "without full-attention layers" in reason


def test_the_sweep_walks_the_swa_radix_cache_only() -> None:
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache

    pool, _, req_pool = _pools()
    canary = _canary_pool(pool, req_pool)
    assert canary.sweep_refusal(object.__new__(SWARadixCache)) is None
    assert "needs SGLang's SWARadixCache" in canary.sweep_refusal(object.__new__(RadixCache))


def test_unlocked_leaves_are_the_childless_nodes_no_request_holds() -> None:
    def node(id_: int, *, lock: int = 0, children=(), value=(1, 2)):
        made = SimpleNamespace(id=id_, full_lock_ref=lock, value=torch.tensor(value),
                               children={i: c for i, c in enumerate(children)})
        return made

    free_leaf, held_leaf, empty_leaf = node(3), node(4, lock=1), node(5, value=())
    root = SimpleNamespace(children={0: node(1, children=(free_leaf, held_leaf)),
                                     1: empty_leaf})
    pool, _, req_pool = _pools()
    leaves = _canary_pool(pool, req_pool).unlocked_leaves(SimpleNamespace(root_node=root))
    assert leaves == [free_leaf]


def test_the_hybrid_configurator_s_cell_gains_a_record_and_the_swa_owners() -> None:
    assert hybrid_swa_token_bytes(swa_full_tokens_ratio=0.8) == pytest.approx(
        RECORD_BYTES + 0.8 * WINDOW_OWNER_BYTES)
    configurator = SimpleNamespace(_full_layers_num=2, _cell_size=3686.4)
    model_runner = SimpleNamespace(server_args=SimpleNamespace(swa_full_tokens_ratio=0.5))
    add_canary_bytes_to_swa_cell_size(None, configurator, model_runner)
    assert configurator._cell_size == pytest.approx(3686.4 + RECORD_BYTES + 0.5 * 8)
    all_swa = SimpleNamespace(_full_layers_num=0, _cell_size=100.0)
    add_canary_bytes_to_swa_cell_size(None, all_swa, model_runner)
    assert all_swa._cell_size == 100.0


def test_window_faults_flip_the_window_slot_s_bytes_inside_the_window() -> None:
    pool, allocator, req_pool = _pools()
    full = allocator.alloc(4)
    window_slots = allocator.full_to_swa_index_mapping[full]
    canary = _canary_pool(pool, req_pool)
    flips = FingerprintedBytes(pool=canary, sub_pool=KvSubPool.WINDOW)
    assert flips.position_range(prefix_len=20) == range(20 - WINDOW, 20)
    before = [b.buffer.clone() for b in canary.fingerprint_buffers()]
    name, undo = flips.flip(slot=full[1:2], rng=random.Random(0))
    assert name.startswith("swa_layer")
    changed = [(index, (b.buffer != old).nonzero()[:, 0].unique().tolist())
               for index, (b, old) in enumerate(zip(canary.fingerprint_buffers(), before))
               if not torch.equal(b.buffer, old)]
    assert len(changed) == 1 and changed[0][0] >= 2 and changed[0][1] == [int(window_slots[1])]
    undo()
    assert all(torch.equal(b.buffer, old) for b, old in zip(canary.fingerprint_buffers(), before))
    full_only = FingerprintedBytes(pool=canary, sub_pool=KvSubPool.FULL)
    for seed in range(8):
        name, undo = full_only.flip(slot=full[:1], rng=random.Random(seed))
        assert name.startswith("full_layer")
        undo()


def test_a_window_fault_on_a_plain_pool_names_the_variable() -> None:
    plain = MHACanaryPool(MHATokenToKVPool(8, page_size=1, dtype=torch.bfloat16, head_num=1,
                                           head_dim=8, layer_num=1, device="cpu",
                                           enable_memory_saver=False, enable_alt_stream=False))
    with pytest.raises(ValueError, match="SGLANG_KV_CANARY_PERTURB_KV_SUB_POOL=window"):
        FingerprintedBytes(pool=plain, sub_pool=KvSubPool.WINDOW)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
