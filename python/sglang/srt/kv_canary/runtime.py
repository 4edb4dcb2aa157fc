"""The canary of one ModelRunner: installed beside its KV pool, driven once per forward step.

:func:`install_canary` runs when the pool exists (before CUDA-graph capture): it refuses
unsupported pools, allocates the device state, wraps ``model.forward`` (the in-forward part, see
:mod:`.model_forward`) and attaches a :class:`CanaryRuntime` to the runner.
:meth:`CanaryRuntime.run_step` brackets every ``ModelRunner.forward`` on the host, outside any
graph: poll the counters of earlier forwards, check the mode, refresh the token history (token
checks), inject faults, run the forward, undo the faults, enqueue this forward's counter copy,
periodic health and stats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from sglang.jit_kernel.kv_canary.batch_view import CanaryDeviceState
from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.batch_view_builder import canary_layout
from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.device_state import allocate_device_state, layer0_key_buffer
from sglang.srt.kv_canary.kernels import CanaryKernels
from sglang.srt.kv_canary.memory_budget import CanaryMemory
from sglang.srt.kv_canary.model_forward import install_model_forward
from sglang.srt.kv_canary.monitor import CanaryMonitor
from sglang.srt.kv_canary.perturb.injector import FaultInjector, build_fault_injector
from sglang.srt.kv_canary.refusals import refuse_unless_supported, unsupported_pools
from sglang.srt.kv_canary.snapshots import event_factory_for

if TYPE_CHECKING:
    from sglang.srt.kv_canary.token_checks.checks import TokenChecks

logger = logging.getLogger(__name__)

_RUNTIME_ATTRIBUTE = "_kv_canary_runtime"
_T = TypeVar("_T")


class CanaryRuntime:
    """Device state, monitor, fault injector and token checks of one ModelRunner (its in-forward
    part is the :class:`~.model_forward.CanaryModelForward` installed on the model)."""

    def __init__(
        self,
        *,
        state: CanaryDeviceState,
        monitor: CanaryMonitor,
        injector: FaultInjector | None,
        token_checks: TokenChecks | None = None,
    ) -> None:
        self.state = state
        self.monitor = monitor
        self._injector = injector
        self._token_checks = token_checks
        self._steps = 0
        self._live_forwards = 0

    @property
    def token_checks(self) -> TokenChecks | None:
        """Verify-token and the write-input assert; None when both are off."""
        return self._token_checks

    @property
    def steps(self) -> int:
        """Forward steps completed since serving started."""
        return self._steps

    def run_step(self, *, forward_batch: Any, run_forward: Callable[[], _T]) -> _T:
        """Run one ``ModelRunner.forward`` (``run_forward``) under the canary's host-side work.

        With the token checks on, the batch's token-history snapshot (taken at
        ``ForwardBatch.init_new``) is copied and scattered into the history pool here: outside
        any graph, on the forward's stream, before the eager forward or the graph replay reads it.

        Raises:
            UnsupportedForwardModeError: the batch's mode is not checked by the canary.
            CanaryViolationError: raise mode, and an earlier forward produced violation rows.
            CanaryHealthError: the periodic health check failed (any mode).
            RuntimeError: token checks on, and the batch carries no token-history snapshot.
        """
        self.monitor.poll()
        layout = canary_layout(forward_batch.forward_mode)
        live = layout is not None and forward_batch.batch_size > 0
        if live and self._token_checks is not None:
            self._token_checks.populate_history(forward_batch)
        faults = (
            self._injector.inject(forward_batch=forward_batch, step=self._live_forwards)
            if live and self._injector is not None
            else []
        )
        try:
            result = run_forward()
        finally:
            for fault in reversed(faults):
                fault.undo()
        self._steps += 1
        self._live_forwards += int(live)
        self.monitor.after_forward(steps=self._steps, live_forwards=self._live_forwards)
        return result

    def reset_for_serving(self) -> None:
        """Zero the device counters once start-up (warm-up runs, graph capture) is over.

        Violation rows cannot exist yet (start-up batches only have padding rows), and step
        numbers and stats then count serving forwards only. Synchronizes once, at start-up.
        """
        self.state.counters.zero_()
        if self._token_checks is not None:
            self._token_checks.start_serving()
        if self.state.counters.is_cuda:
            torch.cuda.synchronize(self.state.counters.device)


def install_canary(
    *, model_runner: Any, config: CanaryConfig, kernels: CanaryKernels, memory_source: str
) -> CanaryRuntime:
    """Install the canary on a ModelRunner whose memory pool exists (before graph capture).

    Reads ``model_runner.req_to_token_pool``, ``.token_to_kv_pool``, ``.model`` and
    ``.model_config.vocab_size``, and with the token checks ``.server_args``,
    ``.max_running_requests`` and the token oracle's manager (write-input assert); sets
    ``model.forward`` and attaches the runtime to the runner. ``memory_source`` (where the
    canary's memory was budgeted) goes into the one start-up line.

    Raises:
        CanaryUnsupportedError: the pools are not ones the canary supports.
        RuntimeError: the canary is already installed on this runner, or the write-input assert
            is on but no token oracle is installed on the runner.
    """
    if getattr(model_runner, _RUNTIME_ATTRIBUTE, None) is not None:
        raise RuntimeError("KV canary: already installed on this ModelRunner")
    req_to_token_pool = model_runner.req_to_token_pool
    kv_pool = model_runner.token_to_kv_pool
    refuse_unless_supported(
        unsupported_pools(req_to_token_pool=req_to_token_pool, token_to_kv_pool=kv_pool)
    )
    state = allocate_device_state(
        config=config, req_to_token_pool=req_to_token_pool, kv_pool=kv_pool
    )
    token_checks = _token_checks_for(model_runner=model_runner, config=config, kernels=kernels)
    install_model_forward(
        model=model_runner.model, state=state, kernels=kernels, token_checks=token_checks
    )
    runtime = CanaryRuntime(
        state=state,
        monitor=CanaryMonitor(
            state=state, config=config, new_event=event_factory_for(state.counters.device)
        ),
        injector=build_fault_injector(
            config=config.perturb,
            state=state,
            layer0_keys=layer0_key_buffer(kv_pool),
            vocab_size=model_runner.model_config.vocab_size,
        ),
        token_checks=token_checks,
    )
    setattr(model_runner, _RUNTIME_ATTRIBUTE, runtime)
    logger.info(
        _startup_line(config=config, state=state, kernels=kernels, memory_source=memory_source,
                      token_checks=token_checks)
    )
    return runtime


def _token_checks_for(
    *, model_runner: Any, config: CanaryConfig, kernels: CanaryKernels
) -> TokenChecks | None:
    """The runner's token checks (history pool, expectations); None when both are off.

    The token-check modules are imported only here, when a token check is on.
    """
    if not (config.enable_verify_token_assert or config.enable_write_input_assert):
        return None
    from sglang.srt.kv_canary.req_to_expected_token_ids_manager import ReqToVerifyExpectedTokens
    from sglang.srt.kv_canary.token_checks.checks import TokenChecks
    from sglang.srt.kv_canary.token_checks.sizing import max_tokens_per_forward

    oracle = None
    if config.enable_write_input_assert:
        from sglang.srt.kv_canary.token_oracle.install import token_oracle_manager_of

        oracle = token_oracle_manager_of(model_runner)
        if oracle is None:
            raise RuntimeError(
                "KV canary: SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT=1 compares decode inputs "
                "with the token oracle, but no oracle is installed on this ModelRunner (the "
                "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE ModelRunner.initialize hook did not run)"
            )
    req_to_token = model_runner.req_to_token_pool.req_to_token
    # Plain tensors even if start-up runs under inference mode: they are updated in place.
    with torch.inference_mode(False):
        history = ReqToVerifyExpectedTokens(
            num_rows=req_to_token.shape[0],
            max_context_len=req_to_token.shape[1],
            device=req_to_token.device,
            scatter=kernels.scatter_req_token_ids(),
        )
        return TokenChecks(
            history=history,
            verify_token=config.enable_verify_token_assert,
            oracle=oracle,
            expected_capacity=max_tokens_per_forward(
                model_runner.server_args,
                max_running_requests=model_runner.max_running_requests,
            ),
        )


def runtime_of(model_runner: Any) -> CanaryRuntime:
    """The runtime :func:`install_canary` attached to ``model_runner``.

    Raises:
        RuntimeError: none is attached (the memory-pool hook did not run for this runner).
    """
    runtime = getattr(model_runner, _RUNTIME_ATTRIBUTE, None)
    if runtime is None:
        raise RuntimeError(
            "KV canary: this ModelRunner has no canary installed although SGLANG_KV_CANARY_MODE "
            "is on (the hook on ModelRunnerKVCacheMixin.init_memory_pool did not run)"
        )
    return runtime


def _startup_line(
    *,
    config: CanaryConfig,
    state: CanaryDeviceState,
    kernels: CanaryKernels,
    memory_source: str,
    token_checks: TokenChecks | None,
) -> str:
    memory = CanaryMemory(num_slots=state.records.shape[0], ring_capacity=state.ring.shape[0])
    real_data = (
        "off"
        if state.real_kv_words is None
        else f"{config.real_data.value} (layer-0 K, {state.real_kv_num_words * 8} B/slot)"
    )
    return (
        f"KV canary installed: records {RECORD_BYTES} B/slot x {memory.num_slots} slots = "
        f"{memory.record_bytes / 2**20:.2f} MiB, violation ring {memory.ring_capacity} rows "
        f"({memory.ring_bytes / 2**10:.1f} KiB), counters {memory.counter_bytes} B, "
        f"real data {real_data}, {_token_checks_text(token_checks)}, "
        f"kernels {kernels.backend.value}, device {state.records.device}; memory: {memory_source}"
    )


def _token_checks_text(token_checks: TokenChecks | None) -> str:
    if token_checks is None:
        return "token checks off"
    tokens = token_checks.history.tokens
    write_input = (
        f"on (oracle; {token_checks.expected_capacity} tokens preallocated)"
        if token_checks.write_input_assert
        else "off"
    )
    return (
        f"token checks: verify_token {'on' if token_checks.verify_token else 'off'}, "
        f"write_input_assert {write_input}, token history {tokens.shape[0]} rows x "
        f"{tokens.shape[1]} ({tokens.numel() * tokens.element_size() / 2**20:.2f} MiB)"
    )
