"""The in-forward part of the canary: verify, run the model, write + verify.

:class:`CanaryModelForward` replaces ``model.forward`` on the target model *instance*. SGLang's
decode ``CudaGraphRunner`` calls ``model_runner.model.forward(...)`` inside graph capture, and the
eager paths (``forward_decode``/``forward_extend``/``forward_idle``, dummy and warm-up runs) call
it too, so the two canary launches are captured into every decode graph and run around every
eager forward. Nothing here synchronizes with the host or allocates: the batch view is a set of
tensor views and the kernels write into preallocated state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from sglang.jit_kernel.kv_canary.batch_view import CanaryDeviceState
from sglang.srt.kv_canary.batch_view_builder import TokenCheckFields, build_batch_view
from sglang.srt.kv_canary.kernels import CanaryKernels


class CanaryModelForward:
    """Callable installed as ``model.forward``; brackets the original with the canary launches.

    Re-entrancy: only the outermost call runs the canary. A model whose forward calls a wrapped
    forward again (a VLM delegating to an inner language model that ends up here) would otherwise
    verify and write the same batch twice.

    Token checks (``token_checks``): their fields of the batch view (the history, and the
    write-input expectations computed here, inside the forward and so inside captured graphs)
    are built before the pre-forward launch, from inputs the model has not touched yet.
    """

    def __init__(
        self,
        *,
        original: Callable[..., Any],
        state: CanaryDeviceState,
        kernels: CanaryKernels,
        token_checks: TokenCheckFields | None = None,
    ) -> None:
        functools.update_wrapper(self, original)  # keeps inspect.signature(model.forward) intact
        self.original = original
        self._state = state
        self._kernels = kernels
        self._token_checks = token_checks
        self._inside = False

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if self._inside:
            return self.original(input_ids, positions, forward_batch, *args, **kwargs)
        view = build_batch_view(forward_batch, token_checks=self._token_checks)
        if view is None:
            return self.original(input_ids, positions, forward_batch, *args, **kwargs)
        self._inside = True
        try:
            self._kernels.pre_forward_verify(state=self._state, batch=view)
            output = self.original(input_ids, positions, forward_batch, *args, **kwargs)
            self._kernels.post_forward_write_and_verify(state=self._state, batch=view)
        finally:
            self._inside = False
        return output


def install_model_forward(
    *,
    model: torch.nn.Module,
    state: CanaryDeviceState,
    kernels: CanaryKernels,
    token_checks: TokenCheckFields | None = None,
) -> CanaryModelForward:
    """Set ``model.forward`` (an instance attribute) to a :class:`CanaryModelForward`.

    Raises:
        RuntimeError: the instance already carries a canary wrapper.
    """
    current = model.forward
    if isinstance(current, CanaryModelForward):
        raise RuntimeError(
            "KV canary: model.forward is already wrapped; install runs once per model"
        )
    wrapper = CanaryModelForward(
        original=current, state=state, kernels=kernels, token_checks=token_checks
    )
    model.forward = wrapper
    return wrapper


def uninstall_model_forward(model: torch.nn.Module) -> None:
    """Restore the original ``model.forward`` (used by tests that stop the canary on purpose)."""
    wrapper = model.forward
    if not isinstance(wrapper, CanaryModelForward):
        raise RuntimeError("KV canary: model.forward is not wrapped")
    del model.forward
    if model.forward != wrapper.original:  # the wrapped forward was itself an instance attribute
        model.forward = wrapper.original
