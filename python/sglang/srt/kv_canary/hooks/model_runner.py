"""Adapters on ``ModelRunner`` and its KV-cache set-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang.srt.kv_canary.config import get_active_config
from sglang.srt.kv_canary.hook_registration import verify_hooks_applied
from sglang.srt.kv_canary.pools import hybrid_swa_token_bytes
from sglang.srt.kv_canary.runner.canary_runner import create_canary_runner, runner_of
from sglang.srt.kv_canary.runner.memory_budget import host_tier_bytes_per_token, per_token_bytes


def before_initialize(model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``ModelRunner.initialize``: every needed hook in place (HookRegistrationError
    otherwise), then the runner's canary."""
    verify_hooks_applied(get_active_config())
    create_canary_runner(model_runner)


def after_initialize(result: None, model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ModelRunner.initialize``: warm-up and graph capture are over."""
    runner_of(model_runner).on_serving_start()


def around_forward(
    original: Callable[..., Any], model_runner: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``ModelRunner.forward(forward_batch, ...)``."""
    forward_batch = args[0] if args else kwargs["forward_batch"]
    return runner_of(model_runner).run_forward(
        forward_batch=forward_batch, forward=lambda: original(model_runner, *args, **kwargs)
    )


def after_sample(
    next_token_ids: Any, model_runner: Any, logits_output: Any, forward_batch: Any,
    *args: Any, **kwargs: Any,
) -> Any:
    """AFTER ``ModelRunner.sample(logits_output, forward_batch)``: the sampled tokens join the
    token history on the device."""
    runner_of(model_runner).on_sampled(forward_batch=forward_batch, next_token_ids=next_token_ids)
    return next_token_ids


def add_record_bytes_to_cell_size(cell_size: int, *args: Any, **kwargs: Any) -> int:
    """AFTER ``DefaultPoolConfigurator._compute_cell_size(mr, num_layers)``: one record per KV
    token, two with EAGLE (the draft pool, sized like the target's, has its own records), and
    with the hierarchical cache the host tier's records of ``--hicache-ratio`` host slots."""
    model_runner = args[1] if len(args) > 1 else kwargs["mr"]
    server_args = model_runner.server_args
    copies = 1 if server_args.speculative_algorithm is None else 2
    return cell_size + copies * per_token_bytes() + host_tier_bytes_per_token(server_args)


def add_canary_bytes_to_swa_cell_size(result: None, configurator: Any, *args: Any,
                                      **kwargs: Any) -> None:
    """AFTER ``HybridSWAPoolConfigurator.__init__(mr)``: its cell (bytes per full-attention
    token) gains a record and the SWA owner bytes (:func:`hybrid_swa_token_bytes`). An all-SWA
    model (no full layers) is refused when the canary attaches, so its cell is left alone."""
    if configurator._full_layers_num == 0:
        return
    model_runner = args[0] if args else kwargs["mr"]
    configurator._cell_size += hybrid_swa_token_bytes(
        swa_full_tokens_ratio=model_runner.server_args.swa_full_tokens_ratio
    )


def reserve_fixed_bytes(available_bytes: int, model_runner: Any, *args: Any, **kwargs: Any) -> int:
    """AFTER ``ModelRunnerKVCacheMixin._profile_available_bytes``: fixed canary buffers."""
    return runner_of(model_runner).reserve_fixed_bytes(available_bytes)


def after_init_memory_pool(result: None, model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ModelRunnerKVCacheMixin.init_memory_pool``: records beside the new pool."""
    runner_of(model_runner).on_memory_pool()
