"""The pool seam over SGLang's MLA pool and its quantized pools, on the CPU: which buffers real
data reads (views of SGLang's own, never copies), what the kernels' sources look like, the
layouts SGLang 0.5.12 builds (bf16 and FP8 MLA, FP8 MHA, packed FP4 MHA with scales), and the
refusals (an untested attention backend on MLA, ``partial`` over FP4 scale rows shorter than
16 bytes)."""

import random
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.config import RealDataMode
from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.pools import canary_pool_for, record_bytes_per_kv_token
from sglang.srt.kv_canary.pools.mha import MHACanaryPool, MHAFP4CanaryPool
from sglang.srt.kv_canary.pools.mla import TESTED_BACKENDS, MLACanaryPool, backend_refusal
from sglang.srt.kv_canary.pools.real_data import real_data_sources
from sglang.srt.kv_canary.pools.seam import PoolContext
from sglang.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    MHATokenToKVPoolFP4,
    MLATokenToKVPool,
    ReqToTokenPool,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

_TRITON = PoolContext(attention_backends=("triton", "triton"))


def _req_pool() -> ReqToTokenPool:
    return ReqToTokenPool(size=4, max_context_len=16, device="cpu", enable_memory_saver=False)


def _mla_pool(*, dtype: torch.dtype = torch.bfloat16, layers: int = 3, kv_lora_rank: int = 512,
              rope: int = 64, page_size: int = 1) -> MLATokenToKVPool:
    return MLATokenToKVPool(16, page_size=page_size, dtype=dtype, kv_lora_rank=kv_lora_rank,
                            qk_rope_head_dim=rope, layer_num=layers, device="cpu",
                            enable_memory_saver=False)


def _canary(kv_pool, context: PoolContext = _TRITON):
    return canary_pool_for(req_to_token_pool=_req_pool(), token_to_kv_pool=kv_pool,
                           context=context)


@pytest.mark.parametrize(("dtype", "element"), [(torch.bfloat16, 2), (torch.float8_e4m3fn, 1)])
def test_mla_real_data_reads_latent_and_rope_of_the_first_and_last_layer(dtype, element) -> None:
    kv_pool = _mla_pool(dtype=dtype)
    pool = _canary(kv_pool)
    assert isinstance(pool, MLACanaryPool)
    assert pool.num_record_slots == 17 and pool.device == torch.device("cpu")
    buffers = pool.fingerprint_buffers()
    assert [b.name for b in buffers] == ["layer 0 latent", "layer 0 rope", "layer 2 latent",
                                         "layer 2 rope"]
    assert [b.slot_bytes for b in buffers] == [512 * element, 64 * element] * 2
    # views of SGLang's buffer: a write to slot 5's RoPE part shows in the rope source only
    sources = real_data_sources(pool=pool, real_data=RealDataMode.ALL)
    assert sources.words_per_row == (512 * element // 8, 64 * element // 8) * 2
    before = [source[5].clone() for source in sources.sources]
    kv_pool.kv_buffer[2].view(torch.uint8)[5, 0, -1] ^= 0xFF
    changed = [not torch.equal(source[5], old) for source, old in zip(sources.sources, before)]
    assert changed == [False, False, False, True]
    stored = "float8_e4m3fn stored as bytes" if element == 1 else "bfloat16"
    assert f"MLATokenToKVPool ({stored}, latent 512 + RoPE 64)" in pool.describe()


def test_an_mla_layout_whose_parts_are_not_whole_words_is_read_as_one_row() -> None:
    pool = _canary(_mla_pool(dtype=torch.float8_e4m3fn, kv_lora_rank=12, rope=4, layers=1))
    (buffer,) = pool.fingerprint_buffers()
    assert buffer.name == "layer 0 KV" and buffer.slot_bytes == 16


def test_the_real_data_faults_flip_the_strided_mla_parts_in_place() -> None:
    kv_pool = _mla_pool()
    pool = _canary(kv_pool)
    sources = real_data_sources(pool=pool, real_data=RealDataMode.PARTIAL)
    flips = FingerprintedBytes(pool=pool, real_data=sources)
    whole = kv_pool.kv_buffer[0].clone()
    name, undo = flips.flip(slot=torch.tensor([3]), rng=random.Random(0),
                            due_at=(1, 0))  # partial: position 1 at step 0 reads source 1
    assert name == "layer_0_rope"
    differs = (kv_pool.kv_buffer[0] != whole).nonzero()[:, 0].unique().tolist()
    assert differs == [3]  # slot 3 only
    undo()
    assert torch.equal(kv_pool.kv_buffer[0], whole)


@pytest.mark.parametrize("backend", ["fa3", "flashmla", "cutlass_mla", "trtllm_mla"])
def test_mla_is_refused_with_an_untested_attention_backend(backend: str) -> None:
    with pytest.raises(CanaryUnsupportedError) as error:
        _canary(_mla_pool(), PoolContext(attention_backends=(backend, "triton")))
    message = str(error.value)
    assert backend in message and "--attention-backend triton" in message
    assert "tested with the triton and flashinfer attention backends" in message
    assert backend_refusal(TESTED_BACKENDS) is None and backend_refusal(()) is None


def test_fp8_mha_pools_store_bytes_and_are_read_as_such() -> None:
    kv_pool = MHATokenToKVPool(16, page_size=1, dtype=torch.float8_e4m3fn, head_num=2,
                               head_dim=64, layer_num=2, device="cpu",
                               enable_memory_saver=False, enable_alt_stream=False)
    pool = _canary(kv_pool)
    assert type(pool) is MHACanaryPool
    buffers = pool.fingerprint_buffers()
    assert all(b.buffer.dtype == torch.uint8 and b.slot_bytes == 128 for b in buffers)
    assert "MHATokenToKVPool (float8_e4m3fn stored as bytes)" in pool.describe()


def _fp4_pool(*, head_num: int) -> MHATokenToKVPoolFP4:
    return MHATokenToKVPoolFP4(16, page_size=1, dtype=torch.float4_e2m1fn_x2, head_num=head_num,
                               head_dim=64, layer_num=3, device="cpu", enable_memory_saver=False,
                               enable_alt_stream=False)


def test_fp4_real_data_reads_packed_values_and_their_scales() -> None:
    kv_pool = _fp4_pool(head_num=4)
    pool = _canary(kv_pool)
    assert type(pool) is MHAFP4CanaryPool and pool.num_record_slots == 17
    buffers = pool.fingerprint_buffers()
    assert [b.name for b in buffers] == ["layer 0 K", "layer 0 K scales", "layer 2 V",
                                         "layer 2 V scales"]
    assert buffers[0].buffer is kv_pool.k_buffer[0]
    assert buffers[1].buffer is kv_pool.k_scale_buffer[0]
    assert buffers[3].buffer is kv_pool.v_scale_buffer[2]
    # packed: head_dim / 2 bytes per head; scales: one byte per 16 values
    assert [b.slot_bytes for b in buffers] == [4 * 32, 4 * 64 // 16, 4 * 32, 4 * 64 // 16]
    sources = real_data_sources(pool=pool, real_data=RealDataMode.PARTIAL)
    assert sources.words_per_row == (16, 2, 16, 2)
    assert "packed fp4 and scales" in pool.describe()


def test_partial_refuses_fp4_scale_rows_shorter_than_sixteen_bytes() -> None:
    pool = _canary(_fp4_pool(head_num=2))  # 2 * 64 / 16 = 8 scale bytes per slot
    with pytest.raises(CanaryUnsupportedError, match="set SGLANG_KV_CANARY_REAL_DATA=all"):
        real_data_sources(pool=pool, real_data=RealDataMode.PARTIAL)
    assert real_data_sources(pool=pool, real_data=RealDataMode.ALL).words_per_row == (8, 1, 8, 1)


def test_every_pool_sized_by_sglangs_default_configurator_adds_one_record_per_token() -> None:
    for pool_type in (MHACanaryPool, MHAFP4CanaryPool, MLACanaryPool):
        assert pool_type.record_bytes_per_token() == RECORD_BYTES == record_bytes_per_kv_token()
        assert pool_type.extra_record_rows(page_size=16) == 16


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
