"""The in-forward part of the canary: a wrapper on the model instance's ``forward``.

:class:`CanaryModelForward` replaces ``model.forward`` on the target model *instance*. SGLang's
decode ``CudaGraphRunner`` calls ``model_runner.model.forward(...)`` inside graph capture, and the
eager paths (``forward_decode``/``forward_extend``/``forward_idle``, dummy and warm-up runs) call
it too, so the canary's two launches (the runner's ``launch_before_model`` and
``launch_after_model``, given here as the ``before`` and ``after`` callables) are captured into
every decode graph and run around every eager forward.

Re-entrancy: only the outermost call runs the canary. A model whose forward calls a wrapped
forward again (a VLM delegating to an inner language model that ends up here) would otherwise
verify and write the same batch twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# before(forward_batch) -> a view, or None (nothing to check); after(view, *, forward_batch)
BeforeModel = Callable[[Any], Any]
AfterModel = Callable[..., None]


class CanaryModelForward:
    """Callable installed as ``model.forward``; brackets the original with the canary launches."""

    def __init__(
        self, *, original: Callable[..., Any], before: BeforeModel, after: AfterModel
    ) -> None:
        functools.update_wrapper(self, original)  # keeps inspect.signature(model.forward) intact
        self.original = original
        self._before = before
        self._after = after
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
        view = self._before(forward_batch)
        if view is None:
            return self.original(input_ids, positions, forward_batch, *args, **kwargs)
        self._inside = True
        try:
            output = self.original(input_ids, positions, forward_batch, *args, **kwargs)
            self._after(view, forward_batch=forward_batch)
        finally:
            self._inside = False
        return output


def install_model_forward(
    *, model: torch.nn.Module, before: BeforeModel, after: AfterModel
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
    wrapper = CanaryModelForward(original=current, before=before, after=after)
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
