"""Launch a compiled Triton kernel without ``JITFunction.run``'s per-call work.

A ``kernel[grid](...)`` call binds every argument, computes a specialization key from each
one, looks the compiled variant up and only then launches it. For the canary's eager launches
that Python costs far more than the launch itself: 40-57 us per call for the small kernels on
the H100 host of this release's measurements (``benchmark/host_timers``), and about 150-180 us
for the canary forward kernel (61 parameters) on the H200 host
(``benchmark/bench_launch_host.py``).

:class:`DirectLauncher` keeps the compiled variant of each *launch key* and calls its launcher
directly. The key is exact: it determines the variant Triton's own call would pick. Per
parameter it holds

* a constexpr: its value;
* a parameter in the kernel's ``do_not_specialize``: its type (a tensor's dtype; an integer's
  ``i32`` / ``i64`` / ``u64`` class), all Triton's key holds of it;
* any other parameter: what Triton's own binder computes for it (``native_specialize_impl``
  with the parameter's ``is_const`` / alignment flags: a pointer's 16-byte alignment, an
  integer's divisibility by 16 or being 1).

A key seen for the first time goes through the normal ``kernel[grid](...)`` call, which
compiles (or loads) the variant and launches it; at most :data:`MAX_VARIANTS` keys are kept
(beyond, a new key launches through the normal call every time). A kernel whose parameters
carry type annotations other than ``tl.constexpr`` is refused (Triton's binder treats those
differently). Keyword arguments are accepted for the trailing parameters (the constexprs).

It falls back to the normal call, always, where the direct form is not known to match Triton's
own: a Triton other than :data:`SUPPORTED_TRITON` (the launcher's calling convention and the
binder's rule are internal to Triton), an interpreted kernel (``TRITON_INTERPRET=1``), or while
a launch hook is installed (profilers: the hook then sees every launch).

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

try:
    from triton._C.libtriton import native_specialize_impl as _native_specialize_impl
except ImportError:  # another Triton: every launch is a normal call
    _native_specialize_impl = None

SUPPORTED_TRITON = ("3.6.",)  # versions whose CompiledKernel.run convention is the one below
MAX_VARIANTS = 64  # launch keys kept per kernel


def ceil_div(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` for grid sizes on the host: plain integer arithmetic
    (Triton 3.6's ``triton.cdiv`` is a constexpr function, about 2 µs per host call)."""
    return -(-numerator // denominator)


def direct_launches_supported() -> bool:
    """Whether this Triton's compiled kernels can be launched directly."""
    return triton.__version__.startswith(SUPPORTED_TRITON) and _native_specialize_impl is not None


# what the launch key holds of one parameter
_VALUE = 0  # a constexpr: its value
_TYPE = 1  # in do_not_specialize: its type
_SPECIALIZATION = 2  # otherwise: Triton's specialization of the argument


class DirectLauncher:
    """Launches of one ``@triton.jit`` kernel (see the module docstring).

    Args:
        kernel: the ``@triton.jit`` function (or, under ``TRITON_INTERPRET=1``, its interpreted
            form: every launch is then a normal call).
        num_warps: the launch option of every call.
    Raises:
        ValueError: a non-constexpr parameter has a type annotation (names them).
    """

    def __init__(self, kernel: Any, *, num_warps: int) -> None:
        self._kernel = kernel
        self._num_warps = num_warps
        self._direct = direct_launches_supported() and not self._interpreted(kernel)
        self._names = tuple(inspect.signature(kernel.fn).parameters)
        # per parameter: (what the key holds, is_const, specialized on alignment); Triton's
        # own parameter records exist for a compiled kernel only
        params = [] if self._interpreted(kernel) else list(kernel.params)
        annotated = [
            p.name for p in params if not p.is_constexpr and p.annotation not in ("", None)
        ]
        if annotated:
            raise ValueError(
                f"DirectLauncher({kernel.fn.__name__}): parameters {annotated} carry type "
                "annotations; only tl.constexpr annotations are supported"
            )
        self._parts = tuple(
            (_VALUE if p.is_constexpr else _TYPE if p.do_not_specialize else _SPECIALIZATION,
             p.is_const, not p.do_not_specialize_on_alignment)
            for p in params
        )
        self._backends: dict[int, Any] = {}  # per device: the backend Triton's binder uses
        self._variants: dict[tuple[Any, ...], Any] = {}

    @staticmethod
    def _interpreted(kernel: Any) -> bool:
        return isinstance(kernel, InterpretedFunction)

    @property
    def variants(self) -> int:
        """Launch keys launched directly so far (one per device and key, see the module
        docstring)."""
        return len(self._variants)

    def __call__(self, grid: Sequence[int], *args: Any, **named: Any) -> None:
        """Launch over ``grid`` (1 to 3 ints) with every parameter, constexprs included, in the
        kernel's order: positionally, the trailing ones optionally by name.

        Raises:
            TypeError: a parameter is missing, or a name is not a parameter after the
                positional ones.
        """
        if named:
            args = self._with_named(args, named)
        if not self._direct:
            self._kernel[tuple(grid)](*args, num_warps=self._num_warps)
            return
        # the device and stream JITFunction.run would use: the current ones (a variant is
        # loaded per device)
        device = _driver.active.get_current_device()
        backend = self._backends.get(device)
        key = None if backend is None else self._key(device, backend, args)
        compiled = None if key is None else self._variants.get(key)
        if compiled is None or _launch_hooks_installed():
            compiled = self._kernel[tuple(grid)](*args, num_warps=self._num_warps)
            if backend is None:
                self._backends[device] = self._kernel.device_caches[device][3]
            elif len(self._variants) < MAX_VARIANTS:
                self._variants.setdefault(key, compiled)
            return
        stream = _driver.active.get_current_stream(device)
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        compiled.run(
            grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
            None, None, None, *args,
        )

    def _with_named(self, args: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, ...]:
        rest = self._names[len(args):]
        if len(named) != len(rest) or not all(name in named for name in rest):
            missing = [name for name in rest if name not in named]
            unknown = sorted(set(named) - set(rest))
            raise TypeError(
                f"{self._kernel.fn.__name__}: after {len(args)} positional arguments the "
                f"parameters {list(rest)} must be named; missing {missing}, not expected "
                f"{unknown}"
            )
        return (*args, *(named[name] for name in rest))

    def _key(self, device: int, backend: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The launch key of ``args`` (see the module docstring). One pass over the arguments
        with Triton's binder called directly: this runs before every eager launch."""
        if len(args) != len(self._parts):
            raise TypeError(
                f"{self._kernel.fn.__name__} takes {len(self._parts)} arguments, "
                f"got {len(args)}"
            )
        specialize = _native_specialize_impl
        key: list[Any] = [device]
        append = key.append
        for arg, (part, is_const, align) in zip(args, self._parts):
            if part == _SPECIALIZATION:
                append(specialize(backend, arg, is_const, True, align))
            elif part == _VALUE:
                append(arg)
            else:
                append(arg.dtype if isinstance(arg, torch.Tensor) else _int_type(arg))
        return tuple(key)


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
