"""Real SGLang objects for the token checks' CPU tests (not a test module).

* :func:`sglang_reqs`: real ``Req`` objects (``managers/schedule_batch.py``) with pool rows.
* :func:`model_worker_batch`: a real ``ModelWorkerBatch`` of those requests (what the scheduler
  hands to ``ForwardBatch.init_new`` in 0.5.12.post1).
* :func:`prepare_for_init_new`: a canary-installed simulated runner made fit for the real
  ``ForwardBatch.init_new``.
* :func:`token_check_server`: a simulated server with the model runner's canary (token checks,
  and the oracle with the write-input assert) and the ``ForwardBatch.init_new`` adapters the hook
  table selects, as a server installs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from types import SimpleNamespace

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, PerturbConfig, RealDataMode
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.sampling import OracleSampler
from sglang.srt.kv_canary.selfcheck.scenarios import server_hooks, install_canary_runner
from sglang.srt.kv_canary.selfcheck.simulation import (
    VOCAB_SIZE,
    SimulatedModelRunner,
    SimulatedServer,
)
from sglang.srt.kv_canary.tools.worker_batches import (
    model_worker_batch as shared_model_worker_batch,
)
from sglang.srt.managers.schedule_batch import ModelWorkerBatch, Req
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
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
    kernels: CanaryKernels = KERNELS,
) -> tuple[SimulatedServer, CanaryRunner]:
    """A simulated server (page size 4) whose forwards go through the ``ModelRunner.forward``
    adapter; ``forward`` (optional) runs instead, with the server and the batch, and must call
    :func:`run_hooked`."""

    def through_hook(batch: ForwardBatch) -> object:
        if forward is not None:
            return forward(server, batch)
        return run_hooked(server, batch)

    server = SimulatedServer(
        page_size=4, num_pages=48, max_requests=8, max_context_len=96, forward=through_hook,
        hooks=server_hooks(config),
        sampler=OracleSampler(vocab_size=VOCAB_SIZE) if config.enable_token_oracle else None,
    )
    runner = install_canary_runner(model_runner=server.runner, config=config, kernels=kernels)
    return server, runner


def run_hooked(server: SimulatedServer, batch: ForwardBatch) -> object:
    """``ModelRunner.forward`` of the simulated runner through its AROUND adapter."""
    return around_forward(SimulatedModelRunner.forward, server.runner, batch)


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


def model_worker_batch(*, mode: ForwardMode, reqs: Sequence[Req],
                       extend_prefix_lens: Sequence[int] | None = None) -> ModelWorkerBatch:
    """A batch of ``reqs``: DECODE (one token each) or EXTEND/MIXED from ``extend_prefix_lens``
    to each request's whole history."""
    seq_lens = [len(r.origin_input_ids) + len(r.output_ids) for r in reqs]
    num_tokens = (
        len(reqs) if extend_prefix_lens is None
        else sum(s - p for s, p in zip(seq_lens, extend_prefix_lens))
    )
    return shared_model_worker_batch(
        mode=mode, reqs=reqs, req_pool_indices=[r.req_pool_idx for r in reqs],
        seq_lens=seq_lens, extend_prefix_lens=extend_prefix_lens, num_tokens=num_tokens,
        vocab_size=VOCAB_SIZE,
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
            **{**asdict(runner.server_args), "attention_backend": "torch_native",
               "enable_lora": False}
        )
    return runner
