"""Adapters on the decode ``CudaGraphRunner`` and its input buffers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang.srt.kv_canary.runner.canary_runner import runner_of
from sglang.srt.kv_canary.runner.graph_padding import point_padded_rows_at_row_zero


def before_capture(graph_runner: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``CudaGraphRunner.capture``."""
    runner_of(graph_runner.model_runner).on_capture_start(graph_runner=graph_runner)


def around_capture_one_batch_size(
    original: Callable[..., Any], graph_runner: Any, bs: int, forward: Callable[..., Any],
    *args: Any, **kwargs: Any,
) -> Any:
    """AROUND ``CudaGraphRunner.capture_one_batch_size(bs, forward, stream_idx=None)``."""
    return runner_of(graph_runner.model_runner).capture_decode_graph(
        graph_runner=graph_runner, bs=bs,
        capture=lambda wrapped: original(graph_runner, bs, wrapped, *args, **kwargs),
        forward=forward,
    )


def after_replay_prepare(
    result: None, graph_runner: Any, forward_batch: Any, *args: Any, **kwargs: Any
) -> None:
    """AFTER ``CudaGraphRunner.replay_prepare(forward_batch, pp_proxy_tensors=None)``."""
    runner_of(graph_runner.model_runner).on_decode_replay(
        graph_runner=graph_runner, forward_batch=forward_batch
    )


def after_replay(result: Any, graph_runner: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``CudaGraphRunner.replay(forward_batch, skip_attn_backend_init=False, ...)`` (the
    replayed batch size is set by then, by ``replay_prepare`` inside or before it)."""
    runner_of(graph_runner.model_runner).on_graph_replay(graph_runner=graph_runner)


def before_populate_buffers(buffers: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``DecodeInputBuffers.populate_from_forward_batch(*, raw_bs, bs, ...)``."""
    point_padded_rows_at_row_zero(buffers=buffers, raw_bs=kwargs["raw_bs"], bs=kwargs["bs"])
