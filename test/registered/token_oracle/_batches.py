"""Real SGLang batch objects for the oracle's CPU tests.

``forward_batch_from_init_new`` runs the real ``ForwardBatch.init_new`` (0.5.12.post1) on a real
``ModelWorkerBatch`` with a stand-in model runner (CPU, ``torch_native`` positions), then the
package's init_new adapter (the model runner's canary builds the batch's carrier), exactly as the
hooked classmethod does in a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from sglang.srt import server_args as sglang_server_args
from sglang.srt.kv_canary import config as canary_config
from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.hooks.forward_batch import after_init_new
from sglang.srt.kv_canary.runner.canary_runner import (
    RUNNER_ATTRIBUTE,
    CanaryRunner,
    attach_canary_runner,
)
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.tools.worker_batches import greedy_sampling_info
from sglang.srt.kv_canary.tools.worker_batches import (
    model_worker_batch as shared_model_worker_batch,
)
from sglang.srt.layers import sampler as sglang_sampler
from sglang.srt.managers.schedule_batch import ModelWorkerBatch
from sglang.srt.model_executor import forward_batch_info
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

VOCAB_SIZE = 4096
ORACLE_ONLY = CanaryConfig(enable_token_oracle=True)


@dataclass(frozen=True)
class FakeReq:
    rid: str
    bootstrap_room: int | None = None


def model_runner_stub(*, is_draft_worker: bool = False, sampling_backend: str = "token_oracle",
                      speculative_algorithm: str | None = None,
                      disable_overlap_schedule: bool = False,
                      device: str = "cpu") -> SimpleNamespace:
    """The ModelRunner attributes ``ForwardBatch.init_new`` and the canary read (no canary set;
    ``device``: where a canary set on it allocates its buffers, at construction)."""
    server_args = SimpleNamespace(
        attention_backend="torch_native", enable_lora=False, sampling_backend=sampling_backend,
        speculative_algorithm=speculative_algorithm,
        disable_overlap_schedule=disable_overlap_schedule,
    )
    return SimpleNamespace(
        device=device, req_to_token_pool=None, token_to_kv_pool=None, attn_backend=None,
        server_args=server_args, use_ngram_embedding=False, model_is_mrope=False,
        is_hybrid_swa=False, is_draft_worker=is_draft_worker,
        model_config=SimpleNamespace(vocab_size=VOCAB_SIZE),
    )


def with_canary(model_runner: SimpleNamespace, *,
                config: CanaryConfig = ORACLE_ONLY) -> SimpleNamespace:
    """``model_runner`` with a canary set on it, as ``ModelRunner.initialize``'s hook does in a
    server (its oracle's manager built from the served vocabulary, but no sampler registered in
    SGLang's process-wide registry); a model runner that already has one is returned as it is."""
    if getattr(model_runner, RUNNER_ATTRIBUTE, None) is None:
        runner = attach_canary_runner(
            model_runner=model_runner,
            runner=CanaryRunner(config=config, model_runner=model_runner,
                                kernels=load_kernels(KernelBackend.TORCH_REFERENCE)),
        )
        if config.enable_token_oracle:
            runner.use_oracle(TokenOracleManager(oracle=HashOracle(vocab_size=VOCAB_SIZE)))
    return model_runner


def sampling_info(rows: int) -> SamplingBatchInfo:
    return greedy_sampling_info(rows=rows, vocab_size=VOCAB_SIZE)


def model_worker_batch(
    *,
    mode: ForwardMode,
    reqs: Sequence[FakeReq],
    seq_lens: Sequence[int],
    extend_prefix_lens: Sequence[int] | None = None,
    spec_info: object = None,
) -> ModelWorkerBatch:
    rows = len(reqs)
    if extend_prefix_lens is None:
        num_tokens = rows if mode != ForwardMode.TARGET_VERIFY else rows * spec_info.draft_token_num
    else:
        num_tokens = sum(s - p for s, p in zip(seq_lens, extend_prefix_lens))
    return shared_model_worker_batch(
        mode=mode, reqs=reqs, req_pool_indices=range(1, rows + 1), seq_lens=seq_lens,
        extend_prefix_lens=extend_prefix_lens, num_tokens=num_tokens, vocab_size=VOCAB_SIZE,
        spec_info=spec_info,
    )


def forward_batch_from_init_new(batch: ModelWorkerBatch, *, model_runner: object = None,
                                monkeypatch) -> ForwardBatch:
    """The real ``ForwardBatch.init_new`` followed by the package's AFTER adapter (the model
    runner gets an oracle-only canary unless it has one)."""
    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda: False)
    runner = with_canary(model_runner or model_runner_stub())
    forward_batch = ForwardBatch.init_new(batch, runner)
    after_init_new(forward_batch, ForwardBatch, batch, runner)
    return forward_batch


@pytest.fixture
def sampler_environment(monkeypatch):
    """What ``Sampler.__init__`` reads from a running server, stubbed for CPU."""
    server_args = SimpleNamespace(enable_nan_detection=False, rl_on_policy_target=None,
                                  enable_deterministic_inference=False,
                                  sampling_backend="token_oracle")
    monkeypatch.setattr(sglang_sampler, "get_global_server_args", lambda: server_args)
    monkeypatch.setattr(sglang_sampler, "get_tp_group", lambda: SimpleNamespace(device_group=None))
    monkeypatch.setattr(sglang_sampler, "is_dp_attention_enabled", lambda: False)
    monkeypatch.setattr(sglang_sampler, "_CUSTOM_SAMPLER_FACTORIES", {})
    # as in a fresh process (another test may have installed an oracle in this one)
    monkeypatch.setattr(sglang_server_args, "SAMPLING_BACKEND_CHOICES",
                        set(sglang_server_args.SAMPLING_BACKEND_CHOICES) - {"token_oracle"})
    monkeypatch.setattr(canary_config, "_active_config", None)
