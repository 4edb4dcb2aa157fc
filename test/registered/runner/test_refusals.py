"""Start-up refusals name what to change: unsupported flags, pool classes and real-data layouts
stop the server instead of serving unchecked."""

import sys
from dataclasses import dataclass

import pytest
import torch

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner
from sglang.srt.kv_canary.runner.device_state import allocate_device_state
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.runner.refusals import (
    CanaryUnsupportedError,
    unsupported_pools,
    unsupported_server_args,
)
from sglang.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    MHATokenToKVPoolFP4,
    MLATokenToKVPool,
    ReqToTokenPool,
)
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")


@dataclass
class _ServerArgs:
    """The ServerArgs fields the refusals read, at values the canary supports."""

    device: str = "cuda"
    speculative_algorithm: str | None = None
    disable_piecewise_cuda_graph: bool = True
    enable_torch_compile: bool = False
    pp_size: int = 1
    disaggregation_mode: str = "null"
    enable_hierarchical_cache: bool = False
    enable_lmcache: bool = False
    enable_pdmux: bool = False
    dllm_algorithm: str | None = None
    disable_overlap_schedule: bool = False
    speculative_eagle_topk: int | None = None
    enable_multi_layer_eagle: bool = False
    page_size: int | None = None
    enable_dp_attention: bool = False


def test_supported_flags_pass() -> None:
    assert unsupported_server_args(_ServerArgs()) == []
    for algorithm in ("EAGLE", "EAGLE3"):  # spec v2 (overlap on), topk 1, page size 1
        assert unsupported_server_args(
            _ServerArgs(speculative_algorithm=algorithm, speculative_eagle_topk=1, page_size=1)
        ) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"speculative_algorithm": "NGRAM"}, "remove --speculative-algorithm or use EAGLE"),
        ({"speculative_algorithm": "STANDALONE"}, "remove --speculative-algorithm or use EAGLE"),
        ({"disable_overlap_schedule": True}, "keep the overlap schedule"),
        ({"speculative_eagle_topk": 4}, "use --speculative-eagle-topk 1"),
        ({"enable_multi_layer_eagle": True}, "single-layer EAGLE draft"),
        ({"page_size": 16}, "use --page-size 1"),
        ({"enable_dp_attention": True}, "--enable-dp-attention"),
    ],
)
def test_each_unsupported_speculative_setting_is_named(change: dict, named: str) -> None:
    reasons = unsupported_server_args(_ServerArgs(**{"speculative_algorithm": "EAGLE", **change}))
    assert len(reasons) == 1 and named in reasons[0], reasons


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"disable_piecewise_cuda_graph": False}, "pass --disable-piecewise-cuda-graph"),
        ({"pp_size": 2}, "use --pp-size 1"),
        ({"enable_torch_compile": True}, "--enable-torch-compile"),
        ({"disaggregation_mode": "decode"}, "remove --disaggregation-mode"),
        ({"enable_hierarchical_cache": True}, "--enable-hierarchical-cache"),
        ({"enable_lmcache": True}, "--enable-lmcache"),
        ({"enable_pdmux": True}, "--enable-pdmux"),
        ({"dllm_algorithm": "LowConfidence"}, "remove --dllm-algorithm"),
        ({"device": "cpu"}, "python -m sglang.srt.kv_canary.selfcheck"),
    ],
)
def test_each_unsupported_flag_is_named(change: dict, named: str) -> None:
    reasons = unsupported_server_args(_ServerArgs(**change))
    assert len(reasons) == 1 and named in reasons[0], reasons


def _runner_with(
    server_args: _ServerArgs, *, config: CanaryConfig = CanaryConfig(mode=CanaryMode.LOG)
) -> CanaryRunner:
    class ModelRunner:
        device = "cpu"

    model_runner = ModelRunner()
    model_runner.server_args = server_args
    return CanaryRunner(config=config, model_runner=model_runner,
                        kernels=load_kernels(KernelBackend.TORCH_REFERENCE))


def test_the_start_up_check_raises_every_reason_at_once() -> None:
    runner = _runner_with(_ServerArgs(disable_piecewise_cuda_graph=False, pp_size=2))
    with pytest.raises(CanaryUnsupportedError) as raised:
        runner.refuse_unsupported_flags()
    message = str(raised.value)
    assert "--disable-piecewise-cuda-graph" in message and "--pp-size 1" in message
    assert "unset SGLANG_KV_CANARY_MODE" in message
    assert len(raised.value.reasons) == 2


def test_flags_are_not_refused_when_only_the_oracle_is_on() -> None:
    runner = _runner_with(_ServerArgs(pp_size=2), config=CanaryConfig(enable_token_oracle=True))
    runner.refuse_unsupported_flags()


def _req_pool() -> ReqToTokenPool:
    return ReqToTokenPool(size=4, max_context_len=16, device="cpu", enable_memory_saver=False)


def _mha_pool(*, head_dim: int = 8) -> MHATokenToKVPool:
    return MHATokenToKVPool(16, page_size=1, dtype=torch.bfloat16, head_num=1,
                            head_dim=head_dim, layer_num=1, device="cpu",
                            enable_memory_saver=False, enable_alt_stream=False)


def test_plain_mha_pools_are_supported() -> None:
    assert unsupported_pools(req_to_token_pool=_req_pool(), token_to_kv_pool=_mha_pool()) == []


@pytest.mark.parametrize(
    ("pool_class", "advice"),
    [
        (MLATokenToKVPool, "MLA models"),
        (SWAKVPool, "hybrid sliding-window"),
        (MHATokenToKVPoolFP4, "--kv-cache-dtype other than fp4_e2m1"),
    ],
)
def test_other_pool_classes_are_refused_with_advice(pool_class: type, advice: str) -> None:
    pool = object.__new__(pool_class)  # the check looks at the class only
    (reason,) = unsupported_pools(req_to_token_pool=_req_pool(), token_to_kv_pool=pool)
    assert pool_class.__name__ in reason and "MHATokenToKVPool only" in reason and advice in reason


def test_other_request_pools_are_refused() -> None:
    class MambaLikeReqPool(ReqToTokenPool):
        pass

    pool = object.__new__(MambaLikeReqPool)
    (reason,) = unsupported_pools(req_to_token_pool=pool, token_to_kv_pool=_mha_pool())
    assert "MambaLikeReqPool" in reason and "ReqToTokenPool only" in reason


def test_real_data_needs_whole_words_per_row() -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.ALL)
    with pytest.raises(CanaryUnsupportedError, match="SGLANG_KV_CANARY_REAL_DATA=all needs"):
        allocate_device_state(config=config, req_to_token_pool=_req_pool(),
                              kv_pool=_mha_pool(head_dim=3))  # 6-byte rows
    partial = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL)
    with pytest.raises(CanaryUnsupportedError, match="set SGLANG_KV_CANARY_REAL_DATA=all"):
        allocate_device_state(config=partial, req_to_token_pool=_req_pool(),
                              kv_pool=_mha_pool(head_dim=4))  # 8-byte rows < 16
    state = allocate_device_state(config=config, req_to_token_pool=_req_pool(),
                                  kv_pool=_mha_pool(head_dim=4))
    assert state.real_data.words_per_row == (1,) * len(state.real_data.sources)
    assert state.real_data.verify_stride == 1


def test_the_configured_real_data_stride_reaches_the_kernels_inputs() -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL, real_data_stride=4)
    state = allocate_device_state(config=config, req_to_token_pool=_req_pool(),
                                  kv_pool=_mha_pool(head_dim=8))
    assert state.real_data.verify_stride == 4 and state.real_data.partial


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
