"""Resolve, register and verify the hooks of :mod:`.hook_targets` (all or nothing).

* :func:`register_hooks` (plugin load): every target the configuration needs is located in the
  installed SGLang's source (statically: no CUDA-only module is imported, so the check runs in
  the CLI process and on machines without a GPU), every adapter is imported, and only then are
  all of them registered with SGLang's ``HookRegistry``. Any failure raises
  :class:`HookRegistrationError` before anything is registered.
* :func:`verify_hooks_applied` (``ModelRunner.initialize``): every hook the *configuration
  needs* must wrap its target. SGLang's loader only logs a hook that failed to apply, and a
  plugin function that raised; checking against the needed list (not the registered one) makes
  both fatal.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.hook_targets import (
    SUPPORTED_SGLANG_VERSION,
    HookSpec,
    select_hook_specs,
)


class HookRegistrationError(RuntimeError):
    """A hook target is missing, an adapter cannot be imported, or a needed hook is not in
    place; the message names each one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _ResolvedHook:
    spec: HookSpec
    adapter: Callable[..., object]


def _installed_sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - only used in an error message
        return "unknown"


def _find_definition(target: str) -> str | None:
    """Locate ``target`` in SGLang's source without importing the module that defines it.

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


def check_targets_exist(specs: tuple[HookSpec, ...]) -> None:
    """Resolve every target; raise one error naming all missing ones."""
    missing = []
    for spec in specs:
        reason = _find_definition(spec.target)
        if reason is not None:
            missing.append(f"{spec.target} ({reason})")
    if missing:
        raise HookRegistrationError(
            "KV canary: hook target(s) missing from the installed SGLang "
            f"{_installed_sglang_version()}; this package supports exactly sglang "
            f"{SUPPORTED_SGLANG_VERSION}. Missing: " + "; ".join(missing)
        )


def _import_adapter(spec: HookSpec) -> Callable[..., object]:
    module_name, _, function_name = spec.adapter.partition(":")
    try:
        return getattr(importlib.import_module(module_name), function_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is fatal and reported
        raise HookRegistrationError(
            f"KV canary: the adapter {spec.adapter} of hook {spec.target} cannot be loaded: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def register_hooks(config: CanaryConfig) -> tuple[HookSpec, ...]:
    """Check and import every hook the configuration needs, then register all of them.

    Raises:
        HookRegistrationError: a target does not exist or an adapter cannot be imported;
            nothing has been registered then.
    """
    specs = select_hook_specs(config)
    check_targets_exist(specs)
    resolved = [_ResolvedHook(spec=spec, adapter=_import_adapter(spec)) for spec in specs]
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for hook in resolved:
        HookRegistry.register(hook.spec.target, hook.adapter, HookType(hook.spec.hook_type))
    return specs


def _wrapper_chain_contains(function: object, adapter: object) -> bool:
    """True when ``adapter`` is the hook of one of the wrappers around ``function``."""
    current = function
    for _ in range(64):  # bounded: wrapper chains are short
        for cell in getattr(current, "__closure__", None) or ():
            try:
                if cell.cell_contents is adapter:
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


def verify_hooks_applied(config: CanaryConfig) -> None:
    """Confirm every hook ``config`` needs wraps its target.

    Raises:
        HookRegistrationError: naming each needed hook that is not in place (its adapter failed
            to import, registration never happened, or SGLang failed to apply it).
    """
    missing = []
    for spec in select_hook_specs(config):
        module_name, _, function_name = spec.adapter.partition(":")
        try:
            adapter = getattr(importlib.import_module(module_name), function_name)
        except Exception as exc:  # noqa: BLE001 - reported below
            missing.append(f"{spec.target} (adapter {spec.adapter}: {type(exc).__name__})")
            continue
        if not _wrapper_chain_contains(_current_function(spec.target), adapter):
            missing.append(spec.target)
    if missing:
        raise HookRegistrationError(
            "KV canary: these hooks are needed but not in place (see SGLang's 'Failed to load "
            "plugin' / 'Failed to apply hooks' log above); the server would run unchecked: "
            + ", ".join(missing)
        )
