"""Start-up refusals name what to change: unsupported flags stop the server instead of serving
unchecked (pools: test/registered/pools)."""

import sys
from dataclasses import dataclass

import pytest

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.runner.refusals import unsupported_server_args
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
    hicache_storage_backend: str | None = None
    hicache_size: int = 0
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
    assert unsupported_server_args(_ServerArgs(enable_hierarchical_cache=True)) == []
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
        ({"enable_hierarchical_cache": True, "hicache_storage_backend": "file"},
         "--hicache-storage-backend file"),
        ({"enable_hierarchical_cache": True, "hicache_size": 16}, "--hicache-ratio instead"),
        ({"enable_hierarchical_cache": True, "speculative_algorithm": "EAGLE"},
         "remove one of them"),
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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
