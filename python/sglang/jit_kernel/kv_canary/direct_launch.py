"""Launch a compiled Triton kernel without ``JITFunction.run``'s per-call work.

A ``kernel[grid](...)`` call binds every argument, computes a specialization key from each
one, looks the compiled variant up and only then launches it. For the canary's small eager
launches that run every step outside CUDA graphs (the token-history scatter, the oracle's
tokens) that Python costs far more than the launch itself: 40-57 us per call on the H100
host of this release's measurements (``benchmark/host_timers``), against a few us for the
launch.

:class:`DirectLauncher` keeps the compiled variant of each device and argument *type* signature
and calls its launcher directly. That is exact only when the variant depends on nothing but the types, so
the kernel must not specialize on any argument value: every non-constexpr parameter must be in
the kernel's ``do_not_specialize`` (then Triton's key of a tensor is its pointer type and of an
integer ``i32`` / ``i64`` / ``u64``, whatever the value or alignment). The constructor checks
that and raises otherwise. A signature seen for the first time goes through the normal
``kernel[grid](...)`` call, which compiles (or loads) the variant and launches it.

It falls back to the normal call, always, where the direct form is not known to match Triton's
own: a Triton other than :data:`SUPPORTED_TRITON` (the launcher's calling convention is
internal to Triton), an interpreted kernel (``TRITON_INTERPRET=1``), or while a launch hook is
installed (profilers: the hook then sees every launch).

Graph safety: the same launch as ``kernel[grid](...)``, on the current stream of the current
device; nothing allocated, no host sync.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import triton
from triton.runtime import driver as _driver
from triton.runtime.interpreter import InterpretedFunction

SUPPORTED_TRITON = ("3.6.",)  # versions whose CompiledKernel.run convention is the one below


def direct_launches_supported() -> bool:
    """Whether this Triton's compiled kernels can be launched directly."""
    return triton.__version__.startswith(SUPPORTED_TRITON)


class DirectLauncher:
    """Launches of one ``@triton.jit`` kernel whose variants depend on argument types only.

    Args:
        kernel: the ``@triton.jit`` function; every non-constexpr parameter must be in its
            ``do_not_specialize``.
        num_warps: the launch option of every call.
    Raises:
        ValueError: a non-constexpr parameter is specialized on its value (names them).
    """

    def __init__(self, kernel: Any, *, num_warps: int) -> None:
        self._kernel = kernel
        self._num_warps = num_warps
        self._direct = direct_launches_supported() and not self._interpreted(kernel)
        parameters = list(inspect.signature(kernel.fn).parameters.values())
        constexpr = tuple("constexpr" in str(p.annotation) for p in parameters)
        options = kernel.kwargs if self._interpreted(kernel) else {
            "do_not_specialize": kernel.do_not_specialize
        }
        unspecialized = set(options.get("do_not_specialize") or ())
        specialized = [
            p.name for index, (p, is_constexpr) in enumerate(zip(parameters, constexpr))
            if not is_constexpr and p.name not in unspecialized and index not in unspecialized
        ]
        if specialized:
            raise ValueError(
                f"DirectLauncher({kernel.fn.__name__}): parameters {specialized} are specialized "
                "on their values; put every non-constexpr parameter in do_not_specialize"
            )
        self._constexpr = constexpr
        self._variants: dict[tuple[Any, ...], Any] = {}

    @staticmethod
    def _interpreted(kernel: Any) -> bool:
        return isinstance(kernel, InterpretedFunction)

    @property
    def variants(self) -> int:
        """Compiled variants launched directly so far (one per device and argument type
        signature)."""
        return len(self._variants)

    def __call__(self, grid: Sequence[int], *args: Any) -> None:
        """Launch over ``grid`` (1 to 3 ints) with every parameter, constexprs included, in the
        kernel's order."""
        if not self._direct:
            self._kernel[tuple(grid)](*args, num_warps=self._num_warps)
            return
        # the device and stream JITFunction.run would use: the current ones (a variant is
        # loaded per device)
        device = _driver.active.get_current_device()
        key = (device, *(
            arg if constexpr else (arg.dtype if isinstance(arg, torch.Tensor) else _int_type(arg))
            for arg, constexpr in zip(args, self._constexpr)
        ))
        compiled = self._variants.get(key)
        if compiled is None or _launch_hooks_installed():
            compiled = self._kernel[tuple(grid)](*args, num_warps=self._num_warps)
            self._variants.setdefault(key, compiled)
            return
        stream = _driver.active.get_current_stream(device)
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        compiled.run(
            grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
            None, None, None, *args,
        )


def _launch_hooks_installed() -> bool:
    """Whether a launch enter / exit hook is set (Triton 3.6 keeps them in ``HookChain``s)."""
    runtime = triton.knobs.runtime
    return any(
        hook is not None and getattr(hook, "calls", True)
        for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook)
    )


def _int_type(value: Any) -> str:
    """Triton's type of a non-specialized scalar argument (``native_specialize_impl``'s rule)."""
    if isinstance(value, bool):
        return "u1"
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return "i32"
        return "u64" if value >= 2**63 else "i64"
    return type(value).__name__
