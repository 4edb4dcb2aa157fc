"""The canary of one ModelRunner: installed beside its KV pool, driven once per forward step.

:func:`install_canary` runs when the pool exists (before CUDA-graph capture): it refuses
unsupported pools, allocates the device state, wraps ``model.forward`` (the in-forward part, see
:mod:`.model_forward`) and attaches a :class:`CanaryRuntime` to the runner.
:meth:`CanaryRuntime.run_step` brackets every ``ModelRunner.forward`` on the host, outside any
graph: poll the counters of earlier forwards, check the mode, inject faults, run the forward,
undo the faults, enqueue this forward's counter copy, periodic health and stats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

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

logger = logging.getLogger(__name__)

_RUNTIME_ATTRIBUTE = "_kv_canary_runtime"
_T = TypeVar("_T")


class CanaryRuntime:
    """Device state, monitor and fault injector of one ModelRunner (its in-forward part is the
    :class:`~.model_forward.CanaryModelForward` installed on the model)."""

    def __init__(
        self,
        *,
        state: CanaryDeviceState,
        monitor: CanaryMonitor,
        injector: FaultInjector | None,
    ) -> None:
        self.state = state
        self.monitor = monitor
        self._injector = injector
        self._steps = 0
        self._live_forwards = 0

    @property
    def steps(self) -> int:
        """Forward steps completed since serving started."""
        return self._steps

    def run_step(self, *, forward_batch: Any, run_forward: Callable[[], _T]) -> _T:
        """Run one ``ModelRunner.forward`` (``run_forward``) under the canary's host-side work.

        Raises:
            UnsupportedForwardModeError: the batch's mode is not checked by the canary.
            CanaryViolationError: raise mode, and an earlier forward produced violation rows.
            CanaryHealthError: the periodic health check failed (any mode).
        """
        self.monitor.poll()
        layout = canary_layout(forward_batch.forward_mode)
        live = layout is not None and forward_batch.batch_size > 0
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
        if self.state.counters.is_cuda:
            torch.cuda.synchronize(self.state.counters.device)


def install_canary(
    *, model_runner: Any, config: CanaryConfig, kernels: CanaryKernels, memory_source: str
) -> CanaryRuntime:
    """Install the canary on a ModelRunner whose memory pool exists (before graph capture).

    Reads ``model_runner.req_to_token_pool``, ``.token_to_kv_pool`` and ``.model``; sets
    ``model.forward`` and attaches the runtime to the runner. ``memory_source`` (where the
    canary's memory was budgeted) goes into the one start-up line.

    Raises:
        CanaryUnsupportedError: the pools are not ones the canary supports.
        RuntimeError: the canary is already installed on this runner.
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
    install_model_forward(model=model_runner.model, state=state, kernels=kernels)
    runtime = CanaryRuntime(
        state=state,
        monitor=CanaryMonitor(
            state=state, config=config, new_event=event_factory_for(state.counters.device)
        ),
        injector=build_fault_injector(
            config=config.perturb, state=state, layer0_keys=layer0_key_buffer(kv_pool)
        ),
    )
    setattr(model_runner, _RUNTIME_ATTRIBUTE, runtime)
    logger.info(
        _startup_line(config=config, state=state, kernels=kernels, memory_source=memory_source)
    )
    return runtime


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
    *, config: CanaryConfig, state: CanaryDeviceState, kernels: CanaryKernels, memory_source: str
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
        f"real data {real_data}, kernels {kernels.backend.value}, device {state.records.device}; "
        f"memory: {memory_source}"
    )
