"""Adapters on ``ForwardBatch``."""

from __future__ import annotations

from typing import Any

from sglang.srt.kv_canary.runner.canary_runner import runner_of


def after_init_new(
    forward_batch: Any, forward_batch_class: type, *args: Any, **kwargs: Any
) -> None:
    """AFTER ``ForwardBatch.init_new(batch, model_runner)``: attach the per-batch carrier."""
    batch = args[0] if args else kwargs["batch"]
    model_runner = args[1] if len(args) > 1 else kwargs["model_runner"]
    runner_of(model_runner).on_init_new(forward_batch=forward_batch, worker_batch=batch)


def after_pad_inputs(
    result: None, forward_batch: Any, model_runner: Any, num_tokens: int, bs: int
) -> None:
    """AFTER ``ForwardBatch._pad_inputs_to_size(model_runner, num_tokens, bs)``."""
    runner_of(model_runner).on_pad_inputs(forward_batch=forward_batch, bs=bs)
