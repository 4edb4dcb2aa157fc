"""Real SGLang objects for the token checks' CPU tests (not a test module).

* :func:`sglang_reqs`: real ``Req`` objects (``managers/schedule_batch.py``) with pool rows.
* :func:`model_worker_batch`: a real ``ModelWorkerBatch`` of those requests (what the scheduler
  hands to ``ForwardBatch.init_new`` in 0.5.12.post1).
* :func:`prepare_for_init_new`: a canary-installed simulated runner made fit for the real
  ``ForwardBatch.init_new``.
* :func:`token_check_server`: a simulated server with the canary, the token checks and the
  ``ForwardBatch.init_new`` hooks the hook table selects, as a server installs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from types import SimpleNamespace

import torch

from sglang.srt.kv_canary import core_hooks
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, PerturbConfig, RealDataMode
from sglang.srt.kv_canary.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.runtime import CanaryRuntime, install_canary
from sglang.srt.kv_canary.selfcheck.sampling import OracleSampler
from sglang.srt.kv_canary.selfcheck.scenarios import init_new_hooks, install_token_oracle
from sglang.srt.kv_canary.selfcheck.simulation import (
    VOCAB_SIZE,
    SimulatedModelRunner,
    SimulatedServer,
)
from sglang.srt.managers.schedule_batch import ModelWorkerBatch, Req
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

KERNELS = load_kernels(KernelBackend.TORCH_REFERENCE)


def token_config(*, verify: bool = True, write_input: bool = True,
                 perturb: PerturbConfig | None = None) -> CanaryConfig:
    return CanaryConfig(
        mode=CanaryMode.LOG,
        real_data=RealDataMode.PARTIAL,
        enable_token_oracle=write_input,
        enable_verify_token_assert=verify,
        enable_write_input_assert=write_input,
        ring_capacity=512,
        perturb=perturb or PerturbConfig(),
    )


def token_check_server(
    config: CanaryConfig,
    *,
    forward: Callable[[SimulatedServer, ForwardBatch], object] | None = None,
) -> tuple[SimulatedServer, CanaryRuntime]:
    """A simulated server (page size 4) whose forwards go through the canary's hook; ``forward``
    (optional) runs instead, with the server and the batch, and must call :func:`run_hooked`."""

    def through_hook(batch: ForwardBatch) -> object:
        if forward is not None:
            return forward(server, batch)
        return run_hooked(server, batch)

    server = SimulatedServer(
        page_size=4, num_pages=48, max_requests=8, max_context_len=96, forward=through_hook,
        init_new_hooks=init_new_hooks(config),
        sampler=OracleSampler(vocab_size=VOCAB_SIZE) if config.enable_token_oracle else None,
    )
    if config.enable_token_oracle:
        install_token_oracle(server.runner)
    runtime = install_canary(model_runner=server.runner, config=config, kernels=KERNELS,
                             memory_source="test")
    runtime.reset_for_serving()
    return server, runtime


def run_hooked(server: SimulatedServer, batch: ForwardBatch) -> object:
    """``ModelRunner.forward`` of the simulated runner through the canary's AROUND hook."""
    return core_hooks.around_model_runner_forward(
        SimulatedModelRunner.forward, server.runner, batch
    )


# ----------------------------------------------------------------------------- real SGLang objects


def sglang_reqs(prompts: Sequence[Sequence[int]], *, outputs: Sequence[Sequence[int]] = (),
                first_row: int = 1) -> list[Req]:
    reqs = []
    for index, prompt in enumerate(prompts):
        req = Req(rid=f"req-{index}", origin_input_text="", origin_input_ids=list(prompt),
                  sampling_params=SamplingParams())
        req.output_ids.extend(outputs[index] if index < len(outputs) else [])
        req.req_pool_idx = first_row + index
        reqs.append(req)
    return reqs


def _sampling_info(rows: int) -> SamplingBatchInfo:
    return SamplingBatchInfo(
        temperatures=torch.ones(rows, 1), top_ps=torch.ones(rows),
        top_ks=torch.ones(rows, dtype=torch.int32), min_ps=torch.zeros(rows),
        is_all_greedy=True, need_top_p_sampling=False, need_top_k_sampling=False,
        need_min_p_sampling=False, vocab_size=VOCAB_SIZE, device="cpu",
    )


def model_worker_batch(*, mode: ForwardMode, reqs: Sequence[Req],
                       extend_prefix_lens: Sequence[int] | None = None) -> ModelWorkerBatch:
    """A batch of ``reqs``: DECODE (one token each) or EXTEND/MIXED from ``extend_prefix_lens``
    to each request's whole history."""
    rows = len(reqs)
    seq_lens = [len(r.origin_input_ids) + len(r.output_ids) for r in reqs]
    if extend_prefix_lens is None:
        extend_seq_lens, num_tokens = None, rows
    else:
        extend_seq_lens = [s - p for s, p in zip(seq_lens, extend_prefix_lens)]
        num_tokens = sum(extend_seq_lens)
    return ModelWorkerBatch(
        forward_mode=mode, input_ids=torch.zeros(num_tokens, dtype=torch.int64),
        req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.arange(1, num_tokens + 1, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64), seq_lens_sum=sum(seq_lens),
        return_logprob=False, top_logprobs_nums=None, token_ids_logprobs=None,
        global_num_tokens=None, global_num_tokens_for_logprob=None, is_extend_in_batch=False,
        all_extend_in_batch=False, can_run_dp_cuda_graph=False, tbo_split_seq_index=None,
        global_forward_mode=None,
        extend_num_tokens=None if extend_seq_lens is None else num_tokens,
        extend_seq_lens=extend_seq_lens,
        extend_prefix_lens=None if extend_prefix_lens is None else list(extend_prefix_lens),
        extend_logprob_start_lens=None if extend_seq_lens is None else [0] * rows,
        extend_input_logprob_token_ids=None, multimodal_inputs=None, encoder_cached=None,
        encoder_lens=None, encoder_lens_cpu=None, encoder_out_cache_loc=None,
        lora_ids=[None] * rows, sampling_info=_sampling_info(rows), spec_info=None,
        reqs=list(reqs),
    )


def prepare_for_init_new(runner: SimulatedModelRunner) -> SimulatedModelRunner:
    """Give a canary-installed simulated runner what the real ``ForwardBatch.init_new`` reads
    of a ModelRunner (CPU, torch-native positions); returns it."""
    runner.attn_backend = None
    runner.use_ngram_embedding = False
    runner.model_is_mrope = False
    runner.is_hybrid_swa = False
    runner.is_draft_worker = False
    if not isinstance(runner.server_args, SimpleNamespace):  # idempotent
        runner.server_args = SimpleNamespace(
            **asdict(runner.server_args), attention_backend="torch_native", enable_lora=False
        )
    return runner
