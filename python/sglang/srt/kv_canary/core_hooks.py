"""Hook implementations of the canary core (targets listed in :mod:`.hook_targets`).

Each function is a thin adapter between one SGLang 0.5.12.post1 call site and the runtime:

* ``ModelRunner.initialize`` BEFORE: refuse unsupported server flags before the model loads;
  AFTER: zero the device counters once warm-up and graph capture are over.
* ``DefaultPoolConfigurator._compute_cell_size`` AFTER and
  ``ModelRunnerKVCacheMixin._profile_available_bytes`` AFTER: budget the canary's memory.
* ``ModelRunnerKVCacheMixin.init_memory_pool`` AFTER: install the canary beside the new pool.
* ``ModelRunner.forward`` AROUND: the host-side work of every forward step.
* ``DecodeInputBuffers.populate_from_forward_batch`` BEFORE: padded graph rows -> request row 0.
* ``CudaGraphRunner.capture`` BEFORE: no stale request rows during (re)capture warm-up runs.
* ``SchedulerRuntimeCheckerMixin.on_idle`` AFTER: report violations while no batch runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang.srt.kv_canary.config import CanaryConfig, get_active_config
from sglang.srt.kv_canary.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.memory_budget import fixed_bytes, per_token_bytes
from sglang.srt.kv_canary.refusals import refuse_unless_supported, unsupported_server_args
from sglang.srt.kv_canary.runtime import install_canary, runtime_of


def refuse_unsupported_server_args(model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``ModelRunner.initialize``: stop start-up on flags the canary cannot check."""
    refuse_unless_supported(unsupported_server_args(model_runner.server_args))


def add_record_bytes_to_cell_size(cell_size: int, *args: Any, **kwargs: Any) -> int:
    """AFTER ``DefaultPoolConfigurator._compute_cell_size``: one record per KV token."""
    return cell_size + per_token_bytes()


def _reserved_bytes(*, config: CanaryConfig, model_runner: Any, page_size: int) -> int:
    """Bytes that do not scale with the KV pool: ring, counters, padding rows, and with the
    token checks their history pool and expectations (bounded before the pools exist)."""
    reserved = fixed_bytes(ring_capacity=config.ring_capacity, page_size=page_size)
    if config.enable_verify_token_assert or config.enable_write_input_assert:
        from sglang.srt.kv_canary.token_checks.sizing import token_check_bytes_bound

        reserved += token_check_bytes_bound(model_runner)
    return reserved


def reserve_fixed_canary_bytes(
    available_bytes: int, model_runner: Any, *args: Any, **kwargs: Any
) -> int:
    """AFTER ``ModelRunnerKVCacheMixin._profile_available_bytes``: ring, counters, padding rows,
    token history."""
    return available_bytes - _reserved_bytes(
        config=get_active_config(), model_runner=model_runner, page_size=model_runner.page_size
    )


def install_after_memory_pool(result: None, model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ModelRunnerKVCacheMixin.init_memory_pool``: records beside the pool, forward
    wrapped, before CUDA-graph capture."""
    config = get_active_config()
    fixed = _reserved_bytes(
        config=config,
        model_runner=model_runner,
        page_size=model_runner.token_to_kv_pool.page_size,
    )
    install_canary(
        model_runner=model_runner,
        config=config,
        kernels=load_kernels(KernelBackend.TRITON),
        memory_source=(
            f"from the KV budget ({per_token_bytes()} B/token added to the KV cell size, "
            f"{fixed} B subtracted from the profiled available memory)"
        ),
    )


def reset_counters_after_initialize(
    result: None, model_runner: Any, *args: Any, **kwargs: Any
) -> None:
    """AFTER ``ModelRunner.initialize``: serving starts with zeroed counters (step 0)."""
    runtime_of(model_runner).reset_for_serving()


def around_model_runner_forward(
    original: Callable[..., Any], model_runner: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``ModelRunner.forward``: poll, check the mode, perturb, forward, undo, snapshot."""
    forward_batch = args[0] if args else kwargs["forward_batch"]
    return runtime_of(model_runner).run_step(
        forward_batch=forward_batch,
        run_forward=lambda: original(model_runner, *args, **kwargs),
    )


def zero_padded_req_pool_indices(buffers: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``DecodeInputBuffers.populate_from_forward_batch``: padded rows -> req_pool_idx 0.

    SGLang 0.5.12 copies ``req_pool_indices[:raw_bs]`` and leaves rows ``[raw_bs, bs)`` of a
    padded replay with the indices of an earlier replay: stale requests whose ``req_to_token``
    rows the canary would verify. Row 0 of ``req_to_token`` is all zeros and marks padding.
    """
    buffers.req_pool_indices[kwargs["raw_bs"] : kwargs["bs"]].zero_()


def clear_graph_inputs_before_capture(graph_runner: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``CudaGraphRunner.capture``: capture (and its eager warm-up runs) with padding only.

    A re-capture (``recapture_if_needed``) would otherwise run the canary eagerly on the stale
    request rows and cache locations of the last replay, verifying and writing records for them.
    """
    graph_runner.buffers.req_pool_indices.zero_()
    graph_runner.buffers.out_cache_loc.zero_()


def poll_when_idle(result: None, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``SchedulerRuntimeCheckerMixin.on_idle``: report the last forwards' violations now."""
    runtime_of(scheduler.tp_worker.model_runner).monitor.poll()
