"""The pool seam: the MHA implementation says what the runner needs of SGLang's MHA pool, every
pool class without an implementation is refused with the reason and what to change, and the
generic device state and real-data sources are built from the seam alone (the MLA, FP8 and FP4
pools: ``test_mla_and_quantized_pools.py``; the hybrid pool: ``test_swa_pool.py``)."""

import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode
from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.pools import (
    CANARY_POOL_TYPES,
    POOL_ADVICE,
    canary_pool_for,
    extra_record_rows,
    pool_refusals,
    record_bytes_per_kv_token,
)
from sglang.srt.kv_canary.pools.mha import MHACanaryPool
from sglang.srt.kv_canary.pools.real_data import real_data_sources
from sglang.srt.kv_canary.pools.seam import FingerprintBuffer, PoolContext, SlotMapping
from sglang.srt.kv_canary.runner.device_state import allocate_device_state
from sglang.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    MLATokenToKVPoolFP4,
    NoOpMHATokenToKVPool,
    NSATokenToKVPool,
    ReqToTokenPool,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")


def _req_pool() -> ReqToTokenPool:
    return ReqToTokenPool(size=4, max_context_len=16, device="cpu", enable_memory_saver=False)


def _mha_pool(*, head_dim: int = 8, layers: int = 1, page_size: int = 1) -> MHATokenToKVPool:
    return MHATokenToKVPool(16, page_size=page_size, dtype=torch.bfloat16, head_num=1,
                            head_dim=head_dim, layer_num=layers, device="cpu",
                            enable_memory_saver=False, enable_alt_stream=False)


def _mha(**kwargs) -> MHACanaryPool:
    return canary_pool_for(req_to_token_pool=_req_pool(), token_to_kv_pool=_mha_pool(**kwargs),
                           context=PoolContext())


def test_plain_mha_pools_are_covered() -> None:
    assert pool_refusals(req_to_token_pool=_req_pool(), token_to_kv_pool=_mha_pool()) == []
    assert isinstance(_mha(), MHACanaryPool)


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_mha_pool_has_a_record_slot_per_kv_slot(page_size: int) -> None:
    kv_pool = _mha_pool(page_size=page_size)
    pool = MHACanaryPool(kv_pool)
    assert pool.slot_mapping is SlotMapping.IDENTITY
    assert pool.num_record_slots == kv_pool.k_buffer[0].shape[0] == 16 + page_size
    assert extra_record_rows(page_size=page_size) == page_size
    assert record_bytes_per_kv_token() == RECORD_BYTES
    assert pool.device == torch.device("cpu")
    assert pool.cached_record_slots(torch.tensor([3, 4], dtype=torch.int32)).dtype == torch.int64


@pytest.mark.parametrize(("layers", "fingerprinted"), [(1, (0,)), (2, (0, 1)), (5, (0, 4))])
def test_real_data_reads_k_and_v_of_the_first_and_last_layer(layers: int, fingerprinted) -> None:
    kv_pool = _mha_pool(layers=layers)
    pool = MHACanaryPool(kv_pool)
    assert pool.fingerprinted_layers() == fingerprinted
    buffers = pool.fingerprint_buffers()
    assert [b.name for b in buffers] == [
        f"layer {layer} {kind}" for layer in fingerprinted for kind in ("K", "V")
    ]
    assert buffers[0].buffer is kv_pool.k_buffer[0] and buffers[1].buffer is kv_pool.v_buffer[0]
    assert buffers[0].slot_bytes == 8 * 2  # one head of 8 bf16
    assert "record slots" in pool.describe() and "layer" in pool.describe()


@pytest.mark.parametrize(
    ("pool_class", "advice"),
    [
        (MLATokenToKVPoolFP4, "not whole 8-byte words"),
        (NSATokenToKVPool, "indexer cache"),
        (NoOpMHATokenToKVPool, "remove --prefill-only-disable-kv-cache"),
    ],
)
def test_other_pool_classes_are_refused_with_advice(pool_class: type, advice: str) -> None:
    pool = object.__new__(pool_class)  # the check looks at the class only
    (reason,) = pool_refusals(req_to_token_pool=_req_pool(), token_to_kv_pool=pool)
    assert pool_class.__name__ in reason
    assert ("MHATokenToKVPool, MHATokenToKVPoolFP4, MLATokenToKVPool, SWAKVPool only"
            in reason)
    assert advice in reason
    with pytest.raises(CanaryUnsupportedError, match=advice):
        canary_pool_for(req_to_token_pool=_req_pool(), token_to_kv_pool=pool,
                        context=PoolContext())
    with pytest.raises(TypeError, match="MHACanaryPool needs an MHATokenToKVPool"):
        MHACanaryPool(pool)


def test_a_pool_class_without_advice_is_refused_by_name() -> None:
    class HomeGrownPool(MHATokenToKVPool):
        pass

    (reason,) = pool_refusals(req_to_token_pool=_req_pool(),
                              token_to_kv_pool=object.__new__(HomeGrownPool))
    assert "the KV pool is HomeGrownPool" in reason and "no canary implementation" in reason


def test_every_advised_pool_class_is_one_without_an_implementation() -> None:
    covered = {pool_type.kind for pool_type in CANARY_POOL_TYPES}
    assert covered == {"MHATokenToKVPool", "MHATokenToKVPoolFP4", "MLATokenToKVPool",
                       "SWAKVPool"}
    assert not covered & set(POOL_ADVICE)


def test_other_request_pools_are_refused() -> None:
    class MambaLikeReqPool(ReqToTokenPool):
        pass

    pool = object.__new__(MambaLikeReqPool)
    (reason,) = pool_refusals(req_to_token_pool=pool, token_to_kv_pool=_mha_pool())
    assert "MambaLikeReqPool" in reason and "ReqToTokenPool only" in reason


_HOST_MODULE = "sglang.srt.mem_cache.memory_pool_host"  # (imports SGLang's CUDA kernels)


def _stand_in(module: str, name: str) -> object:
    """An instance of an empty class named like one of SGLang's that a CPU cannot import."""
    return type(name, (), {"__module__": module})()


def test_the_sweep_walks_the_radix_cache_and_the_hierarchical_cache() -> None:
    from sglang.srt.mem_cache.chunk_cache import ChunkCache
    from sglang.srt.mem_cache.radix_cache import RadixCache

    pool = _mha()
    assert pool.sweep_refusal(object.__new__(RadixCache)) is None
    assert pool.sweep_refusal(_stand_in("sglang.srt.mem_cache.hiradix_cache", "HiRadixCache")) \
        is None
    assert pool.sweep_refusal(_stand_in("elsewhere", "HiRadixCache")) is not None
    reason = pool.sweep_refusal(object.__new__(ChunkCache))
    assert "--disable-radix-cache" in reason and "SGLANG_KV_CANARY_SWEEP_INTERVAL" in reason


def test_the_host_tier_covers_the_host_pool_of_each_plain_pool_only() -> None:
    pool = _mha()
    mha_host, mla_host = (_stand_in(_HOST_MODULE, "MHATokenToKVPoolHost"),
                          _stand_in(_HOST_MODULE, "MLATokenToKVPoolHost"))
    assert pool.host_tier_refusal(mha_host) is None
    reason = pool.host_tier_refusal(mla_host)
    assert "MLATokenToKVPoolHost" in reason and "--enable-hierarchical-cache" in reason


def test_the_host_views_are_the_host_rows_of_the_fingerprinted_buffers() -> None:
    pool = _mha(layers=3)
    layers = len(pool._pool.k_buffer)
    host = _stand_in(_HOST_MODULE, "MHATokenToKVPoolHost")
    host.layout = "layer_first"
    buffer = torch.zeros(2, layers, 40, *pool._pool.k_buffer[0].shape[1:])
    host.k_data_refs = [buffer[0][layer] for layer in range(layers)]
    host.v_data_refs = [buffer[1][layer] for layer in range(layers)]
    views = pool.host_fingerprint_buffers(host)
    assert [view.name for view in views] == [source.name for source in pool.fingerprint_buffers()]
    assert views[-1].buffer.data_ptr() == host.v_data_refs[layers - 1].data_ptr()
    host.layout = "page_head"
    with pytest.raises(ValueError, match="layer_first or page_first layout only"):
        pool.host_fingerprint_buffers(host)


def test_real_data_needs_whole_words_per_row() -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.ALL)
    req_to_token = _req_pool().req_to_token
    with pytest.raises(CanaryUnsupportedError, match="SGLANG_KV_CANARY_REAL_DATA=all needs"):
        allocate_device_state(config=config, pool=_mha(head_dim=3),
                              req_to_token=req_to_token)  # 6-byte rows
    partial = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL)
    with pytest.raises(CanaryUnsupportedError, match="set SGLANG_KV_CANARY_REAL_DATA=all"):
        allocate_device_state(config=partial, pool=_mha(head_dim=4),
                              req_to_token=req_to_token)  # 8-byte rows < 16
    state = allocate_device_state(config=config, pool=_mha(head_dim=4), req_to_token=req_to_token)
    assert state.real_data.words_per_row == (1,) * len(state.real_data.sources)
    assert state.real_data.verify_stride == 1
    assert state.num_slots == 17 and state.records.shape[0] == 17


def test_the_configured_real_data_stride_reaches_the_kernels_inputs() -> None:
    pool = _mha(head_dim=8)
    sources = real_data_sources(pool=pool, real_data=RealDataMode.PARTIAL, verify_stride=4)
    assert sources.verify_stride == 4 and sources.partial
    assert real_data_sources(pool=pool, real_data=RealDataMode.NONE) is None


def test_a_fingerprint_buffer_needs_a_slot_dimension() -> None:
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        FingerprintBuffer(name="flat", buffer=torch.zeros(4))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
