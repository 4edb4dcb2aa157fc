"""Every SGLang function this package hooks, in one table.

This is the one file to port when SGLang changes: each :class:`HookSpec` names a dotted target
inside sglang 0.5.12.post1, the hook type, the implementation (``module:function`` inside this
package, imported only when the feature that needs it is enabled) and the predicate that says
when it is needed.

At registration every selected target is resolved against the installed SGLang first; a missing
one stops start-up with a message naming the target and the supported SGLang version.
:func:`verify_hooks_applied` later confirms that each registered hook really wraps its target
(SGLang's loader only logs failures of ``HookRegistry.apply_hooks``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from sglang.srt.kv_canary.config import CanaryConfig

SUPPORTED_SGLANG_VERSION = "0.5.12.post1"

_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
_FB = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"
_SCHED = "sglang.srt.managers.scheduler.Scheduler"


class HookTargetError(RuntimeError):
    """A hook target is missing from the installed SGLang, or a hook did not take effect."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HookSpec:
    """One hook: where, how, with what, and when it is needed."""

    target: str  # dotted path inside SGLang, e.g. "sglang.srt....ModelRunner.forward"
    hook_type: str  # "before" | "after" | "around" (names of sglang's HookType)
    implementation: str  # "sglang.srt.kv_canary.<module>:<function>"
    needed: Callable[[CanaryConfig], bool]
    purpose: str


def _always(config: CanaryConfig) -> bool:
    return config.anything_enabled


def _canary(config: CanaryConfig) -> bool:
    return config.canary_enabled


def _oracle(config: CanaryConfig) -> bool:
    return config.enable_token_oracle


def _verify_token(config: CanaryConfig) -> bool:
    return config.canary_enabled and config.enable_verify_token_assert


HOOK_SPECS: tuple[HookSpec, ...] = (
    # ---------------------------------------------------------------- foundation
    HookSpec(
        target=f"{_SCHED}.__init__",
        hook_type="before",
        implementation="sglang.srt.kv_canary.startup:log_startup_line",
        needed=_always,
        purpose="one start-up line per scheduler process saying what is enabled",
    ),
    HookSpec(
        target=f"{_MR}.initialize",
        hook_type="before",
        implementation="sglang.srt.kv_canary.startup:check_hooks_at_model_runner_init",
        needed=_always,
        purpose="fail loudly at model-runner init if any needed hook is not in place",
    ),
    # ---------------------------------------------------------------- oracle (issue 3)
    # ---------------------------------------------------------------- core (issue 4)
    # ---------------------------------------------------------------- token checks (issue 5)
)


# ----------------------------------------------------------------------------- registration

_registered: list[tuple[HookSpec, Callable[..., object]]] = []


def select_hook_specs(config: CanaryConfig) -> tuple[HookSpec, ...]:
    """The hooks the enabled features need."""
    return tuple(spec for spec in HOOK_SPECS if spec.needed(config))


def _find_definition(target: str) -> str | None:
    """Locate ``target`` in SGLang's source without importing the module that defines it.

    Static on purpose: modules such as the scheduler import CUDA libraries at import time, and
    the check must also run (and be cheap) in the CLI process and on machines without a GPU.

    Returns:
        None when the target is defined, else the reason it is not.
    """
    parts = target.split(".")
    spec = importlib.util.find_spec(parts[0])
    depth = 1
    while spec is not None and spec.submodule_search_locations is not None and depth < len(parts):
        child = importlib.util.find_spec(".".join(parts[: depth + 1]))  # imports packages only
        if child is None:
            break
        spec, depth = child, depth + 1
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return f"module {'.'.join(parts[:depth])} not found"
    module_name, attribute_path = ".".join(parts[:depth]), parts[depth:]
    if not attribute_path:
        return f"{target} is a module, not a function or method"
    with open(spec.origin, encoding="utf-8") as source:
        body: list[ast.stmt] = ast.parse(source.read()).body
    scope = module_name
    for index, name in enumerate(attribute_path):
        node = next((n for n in body if _defines(n, name)), None)
        if node is None:
            return f"{scope} has no attribute {name!r}"
        if index < len(attribute_path) - 1:
            if not isinstance(node, ast.ClassDef):
                return f"{scope}.{name} is not a class"
            body, scope = node.body, f"{scope}.{name}"
    return None


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def _installed_sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - only used in an error message
        return "unknown"


def check_targets_exist(specs: tuple[HookSpec, ...]) -> None:
    """Resolve every target; raise one error naming all missing ones."""
    missing = []
    for spec in specs:
        reason = _find_definition(spec.target)
        if reason is not None:
            missing.append(f"{spec.target} ({reason})")
    if missing:
        raise HookTargetError(
            "KV canary: hook target(s) missing from the installed SGLang "
            f"{_installed_sglang_version()}; this package supports exactly sglang "
            f"{SUPPORTED_SGLANG_VERSION}. Missing: " + "; ".join(missing)
        )


def _load_implementation(spec: HookSpec) -> Callable[..., object]:
    module_name, _, function_name = spec.implementation.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def register_hooks(config: CanaryConfig) -> tuple[HookSpec, ...]:
    """Check and register every hook the enabled features need with SGLang's HookRegistry.

    Raises:
        HookTargetError: a target does not exist in the installed SGLang.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    specs = select_hook_specs(config)
    check_targets_exist(specs)
    for spec in specs:
        implementation = _load_implementation(spec)
        HookRegistry.register(spec.target, implementation, HookType(spec.hook_type))
        _registered.append((spec, implementation))
    return specs


def registered_hook_specs() -> tuple[HookSpec, ...]:
    return tuple(spec for spec, _ in _registered)


def _wrapper_chain_contains(function: object, implementation: object) -> bool:
    """True when ``implementation`` is the hook of one of the wrappers around ``function``."""
    current = function
    for _ in range(64):  # bounded: wrapper chains are short
        for cell in getattr(current, "__closure__", None) or ():
            try:
                if cell.cell_contents is implementation:
                    return True
            except ValueError:  # empty cell
                continue
        current = getattr(current, "__wrapped__", None)
        if current is None:
            return False
    return False


def _current_function(target: str) -> object | None:
    """The object now bound at ``target``, or None when it cannot be imported."""
    module_path, _, attribute = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(module_path)
    except (ImportError, AttributeError, ValueError):
        return None
    raw = vars(owner).get(attribute) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return getattr(owner, attribute, None)


def verify_hooks_applied() -> None:
    """Confirm every registered hook wraps its target.

    Raises:
        HookTargetError: naming each hook that is not in place.
    """
    missing = [
        spec.target
        for spec, implementation in _registered
        if not _wrapper_chain_contains(_current_function(spec.target), implementation)
    ]
    if missing:
        raise HookTargetError(
            "KV canary: these hooks were registered but are not in place (see SGLang's "
            "'Failed to apply hooks' log above): " + ", ".join(missing)
        )
