"""Launch a compiled Triton kernel without ``JITFunction.run``'s per-call work.

A ``kernel[grid](...)`` call binds every argument, computes a specialization key from each
one, looks the compiled variant up and only then launches it. For the canary's eager launches
that Python costs far more than the launch itself: tens of microseconds per call for the small
kernels, over a hundred for the canary forward kernel (61 parameters).

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

:meth:`DirectLauncher.with_tail` binds the trailing parameters once (a launch whose last
arguments never change: the canary's device state, its constexprs): each call then passes only
the leading arguments, and only those enter the key (the bound tail's part of Triton's key is the
same for every call).

Graph safety: the same launch as ``kernel[grid](...)``, on the current stream of the current
device; nothing allocated, no host sync.
"""

from __future__ import annotations

import inspect
import weakref
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
        # made by with_tail, while they live (their variants count here; a tail holds tensors)
        self._tails: weakref.WeakSet[TailLauncher] = weakref.WeakSet()

    @staticmethod
    def _interpreted(kernel: Any) -> bool:
        return isinstance(kernel, InterpretedFunction)

    @property
    def variants(self) -> int:
        """Launch keys launched directly so far (one per device and key, see the module
        docstring), those of its :meth:`with_tail` launchers included."""
        return len(self._variants) + sum(len(tail._variants) for tail in self._tails)

    def with_tail(self, tail: Sequence[Any]) -> TailLauncher:
        """A launcher of this kernel whose last ``len(tail)`` parameters are always ``tail``
        (positionally, constexprs included). Its calls take the leading parameters only, and
        only they are keyed: keep the tail's tensors themselves unchanged (the same storage; a
        tensor's alignment is part of Triton's key).

        Raises:
            ValueError: the tail is longer than the kernel's parameters.
        """
        return TailLauncher(parent=self, tail=tuple(tail))

    def __call__(self, grid: Sequence[int], *args: Any, **named: Any) -> None:
        """Launch over ``grid`` (1 to 3 ints) with every parameter, constexprs included, in the
        kernel's order: positionally, the trailing ones optionally by name.

        Raises:
            TypeError: a parameter is missing, or a name is not a parameter after the
                positional ones.
        """
        if named:
            args = self._with_named(args, named)
        if len(args) != len(self._names):
            raise TypeError(
                f"{self._kernel.fn.__name__} takes {len(self._names)} arguments, "
                f"got {len(args)}"
            )
        self._launch(grid, args, args, self._parts, self._variants)

    def _launch(self, grid: Sequence[int], args: tuple[Any, ...], keyed: tuple[Any, ...],
                parts: tuple[tuple[int, bool, bool], ...],
                variants: dict[tuple[Any, ...], Any]) -> None:
        """Launch ``args`` (every parameter) over ``grid``: directly when ``variants`` holds the
        variant of the key of ``keyed`` (the leading arguments that ``parts`` describe), else
        through the normal call (keeping its variant)."""
        if not self._direct:
            self._kernel[tuple(grid)](*args, num_warps=self._num_warps)
            return
        # the device and stream JITFunction.run would use: the current ones (a variant is
        # loaded per device)
        device = _driver.active.get_current_device()
        backend = self._backends.get(device)
        key = None if backend is None else _launch_key(device, backend, keyed, parts)
        compiled = None if key is None else variants.get(key)
        if compiled is None or _launch_hooks_installed():
            compiled = self._kernel[tuple(grid)](*args, num_warps=self._num_warps)
            if backend is None:
                self._backends[device] = self._kernel.device_caches[device][3]
            elif len(variants) < MAX_VARIANTS:
                variants.setdefault(key, compiled)
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


class TailLauncher:
    """:meth:`DirectLauncher.with_tail`: launches of one kernel whose trailing arguments are
    fixed. Call it with the leading arguments only, positionally."""

    def __init__(self, *, parent: DirectLauncher, tail: tuple[Any, ...]) -> None:
        head = len(parent._names) - len(tail)
        if head < 0:
            raise ValueError(
                f"{parent._kernel.fn.__name__} takes {len(parent._names)} arguments; a tail of "
                f"{len(tail)} does not fit"
            )
        self._parent = parent
        self._tail = tail
        self._head = head
        self._head_parts = parent._parts[:head]  # empty for an interpreted kernel (not keyed)
        self._variants: dict[tuple[Any, ...], Any] = {}
        parent._tails.add(self)

    def __call__(self, grid: Sequence[int], *head: Any) -> None:
        """Launch over ``grid`` with ``head`` (the leading parameters) and the bound tail.

        Raises:
            TypeError: ``head`` is not as long as the parameters before the tail.
        """
        if len(head) != self._head:
            raise TypeError(
                f"{self._parent._kernel.fn.__name__} with a bound tail takes "
                f"{self._head} leading arguments, got {len(head)}"
            )
        self._parent._launch(grid, (*head, *self._tail), head, self._head_parts,
                             self._variants)


def _launch_key(device: int, backend: Any, args: tuple[Any, ...],
                parts: tuple[tuple[int, bool, bool], ...]) -> tuple[Any, ...]:
    """The launch key of ``args`` described by ``parts`` (see the module docstring). One pass
    over the arguments with Triton's binder called directly: this runs before every eager
    launch."""
    specialize = _native_specialize_impl
    key: list[Any] = [device]
    append = key.append
    for arg, (part, is_const, align) in zip(args, parts):
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
