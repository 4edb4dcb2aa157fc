"""Adapters on SGLang's EAGLE (speculative decoding) workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang.srt.kv_canary.batch.carrier import runner_of_batch
from sglang.srt.kv_canary.runner.canary_runner import runner_of


def around_draft_capture_one_batch_size(
    original: Callable[..., Any], graph_runner: Any, num_seqs: int, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``EAGLEDraftCudaGraphRunner.capture_one_batch_size(num_seqs, forward, ...)``."""
    return runner_of(graph_runner.model_runner).capture_draft_graph(
        graph_runner=graph_runner,
        capture=lambda: original(graph_runner, num_seqs, *args, **kwargs),
    )


def around_draft_replay(
    original: Callable[..., Any], graph_runner: Any, forward_batch: Any, *args: Any,
    **kwargs: Any,
) -> Any:
    """AROUND ``EAGLEDraftCudaGraphRunner.replay(forward_batch)``."""
    return runner_of(graph_runner.model_runner).replay_draft(
        graph_runner=graph_runner, forward_batch=forward_batch,
        replay=lambda: original(graph_runner, forward_batch, *args, **kwargs),
    )


def around_draft_extend_capture_one_batch_size(
    original: Callable[..., Any], graph_runner: Any, bs: int, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size(bs, forward, ...)``."""
    return runner_of(graph_runner.model_runner).capture_draft_extend_graph(
        graph_runner=graph_runner,
        capture=lambda: original(graph_runner, bs, *args, **kwargs),
    )


def around_draft_extend_replay(
    original: Callable[..., Any], graph_runner: Any, forward_batch: Any, *args: Any,
    **kwargs: Any,
) -> Any:
    """AROUND ``EAGLEDraftExtendCudaGraphRunner.replay(forward_batch)``."""
    return runner_of(graph_runner.model_runner).replay_draft_extend(
        graph_runner=graph_runner, forward_batch=forward_batch,
        replay=lambda: original(graph_runner, forward_batch, *args, **kwargs),
    )


def before_prepare_draft_pass(
    draft_input: Any, req_to_token_pool: Any, batch: Any, cuda_graph_runner: Any,
    draft_model_runner: Any, *args: Any, **kwargs: Any,
) -> None:
    """BEFORE ``EagleDraftInputV2Mixin.prepare_for_v2_draft(req_to_token_pool, batch,
    cuda_graph_runner, draft_model_runner, topk, num_steps)``: a draft pass starts."""
    runner_of(draft_model_runner).on_draft_pass_start()


def around_verify_sample(
    original: Callable[..., Any], verify_input: Any, batch: Any, logits_output: Any,
    *args: Any, **kwargs: Any,
) -> Any:
    """AROUND ``EagleVerifyInputV2Mixin.sample(batch, logits_output, vocab_mask=None)``: the
    oracle picks the tokens; the canary keeps the accepted tokens' owner chains."""
    return runner_of_batch(batch.sampling_info).sample_eagle_verify(
        batch=batch, logits_output=logits_output,
        verify_input=verify_input,
        sample=lambda: original(verify_input, batch, logits_output, *args, **kwargs),
    )
