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


def _token_history(config: CanaryConfig) -> bool:
    """Either token check reads the request histories (write-input: prompt tokens)."""
    return config.canary_enabled and (
        config.enable_verify_token_assert or config.enable_write_input_assert
    )


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
    HookSpec(
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="before",
        implementation="sglang.srt.kv_canary.token_oracle.sampler:"
                       "register_backend_before_cli_parsing",
        needed=_oracle,
        purpose="register the token_oracle sampling backend before argparse reads "
                "SAMPLING_BACKEND_CHOICES, so --sampling-backend token_oracle parses",
    ),
    HookSpec(
        target=f"{_MR}.initialize",
        hook_type="before",
        implementation="sglang.srt.kv_canary.token_oracle.install:"
                       "install_token_oracle_before_model_runner_init",
        needed=_oracle,
        purpose="build the oracle from the served model's vocab and register the backend "
                "before initialize() calls create_sampler()",
    ),
    HookSpec(
        target=f"{_FB}.init_new",
        hook_type="after",
        implementation="sglang.srt.kv_canary.request_id_hooks:attach_request_ids_after_init_new",
        needed=_oracle,
        purpose="rids_int / bootstrap_room_ids_int on the ForwardBatch and its sampling_info",
    ),
    HookSpec(
        target=f"{_FB}._pad_inputs_to_size",
        hook_type="after",
        implementation="sglang.srt.kv_canary.request_id_hooks:pad_request_ids_after_pad_inputs",
        needed=_oracle,
        purpose="pad the ids (rids 0, rooms -1) with the batch and keep sampling_info in sync",
    ),
    HookSpec(
        target="sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner."
               "capture_one_batch_size",
        hook_type="around",
        implementation="sglang.srt.kv_canary.request_id_graph_buffers:"
                       "capture_decode_graph_with_request_ids",
        needed=_oracle,
        purpose="the decode/verify capture batch reads graph-resident id buffers [:bs]",
    ),
    HookSpec(
        target="sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.replay_prepare",
        hook_type="after",
        implementation="sglang.srt.kv_canary.request_id_graph_buffers:"
                       "fill_decode_graph_request_ids_after_replay_prepare",
        needed=_oracle,
        purpose="before every decode/verify replay: ids [:raw_bs] from the live batch, "
                "padded rows reset to 0 / -1",
    ),
    HookSpec(
        target="sglang.srt.speculative.eagle_draft_cuda_graph_runner."
               "EAGLEDraftCudaGraphRunner.capture_one_batch_size",
        hook_type="around",
        implementation="sglang.srt.kv_canary.request_id_graph_buffers:"
                       "capture_draft_graph_with_request_ids",
        needed=_oracle,
        purpose="the EAGLE draft capture batch reads graph-resident id buffers [:bs]",
    ),
    HookSpec(
        target="sglang.srt.speculative.eagle_draft_cuda_graph_runner."
               "EAGLEDraftCudaGraphRunner.replay",
        hook_type="before",
        implementation="sglang.srt.kv_canary.request_id_graph_buffers:"
                       "fill_draft_graph_request_ids_before_replay",
        needed=_oracle,
        purpose="before every EAGLE draft replay: ids [:raw_bs], padded rows reset",
    ),
    HookSpec(
        target="sglang.srt.speculative.eagle_info_v2.EagleVerifyInputV2Mixin.sample",
        hook_type="around",
        implementation="sglang.srt.kv_canary.token_oracle.eagle_verify:sample_verify_with_oracle",
        needed=_oracle,
        purpose="EAGLE v2 verify picks the oracle's tokens (it does not use the sampler)",
    ),
    # ---------------------------------------------------------------- core (issue 4)
    HookSpec(
        target=f"{_MR}.initialize",
        hook_type="before",
        implementation="sglang.srt.kv_canary.core_hooks:refuse_unsupported_server_args",
        needed=_canary,
        purpose="refuse flags the canary cannot check (spec decoding, piecewise graphs, PD, ...)",
    ),
    HookSpec(
        target="sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator"
        "._compute_cell_size",
        hook_type="after",
        implementation="sglang.srt.kv_canary.core_hooks:add_record_bytes_to_cell_size",
        needed=_canary,
        purpose="budget one 32-byte record per KV token inside the KV memory",
    ),
    HookSpec(
        target="sglang.srt.model_executor.model_runner_kv_cache_mixin.ModelRunnerKVCacheMixin"
        "._profile_available_bytes",
        hook_type="after",
        implementation="sglang.srt.kv_canary.core_hooks:reserve_fixed_canary_bytes",
        needed=_canary,
        purpose="budget the violation ring, counters and padding-slot records",
    ),
    HookSpec(
        target="sglang.srt.model_executor.model_runner_kv_cache_mixin.ModelRunnerKVCacheMixin"
        ".init_memory_pool",
        hook_type="after",
        implementation="sglang.srt.kv_canary.core_hooks:install_after_memory_pool",
        needed=_canary,
        purpose="allocate records beside the KV pool and wrap model.forward before graph capture",
    ),
    HookSpec(
        target=f"{_MR}.initialize",
        hook_type="after",
        implementation="sglang.srt.kv_canary.core_hooks:reset_counters_after_initialize",
        needed=_canary,
        purpose="zero the device counters once warm-up and graph capture are over",
    ),
    HookSpec(
        target=f"{_MR}.forward",
        hook_type="around",
        implementation="sglang.srt.kv_canary.core_hooks:around_model_runner_forward",
        needed=_canary,
        purpose="per-step host work: poll violations, mode check, perturb, health, stats",
    ),
    HookSpec(
        target="sglang.srt.model_executor.cuda_graph_runner.DecodeInputBuffers"
        ".populate_from_forward_batch",
        hook_type="before",
        implementation="sglang.srt.kv_canary.core_hooks:zero_padded_req_pool_indices",
        needed=_canary,
        purpose="padded CUDA-graph rows point at req_pool_idx 0, not at stale requests",
    ),
    HookSpec(
        target="sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.capture",
        hook_type="before",
        implementation="sglang.srt.kv_canary.core_hooks:clear_graph_inputs_before_capture",
        needed=_canary,
        purpose="(re)capture warm-up runs see padding rows only, never stale requests",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler_runtime_checker_mixin.SchedulerRuntimeCheckerMixin"
        ".on_idle",
        hook_type="after",
        implementation="sglang.srt.kv_canary.core_hooks:poll_when_idle",
        needed=_canary,
        purpose="report the last forwards' violations while the server is idle",
    ),
    # ---------------------------------------------------------------- token checks (issue 5)
    HookSpec(
        target=f"{_FB}.init_new",
        hook_type="after",
        implementation="sglang.srt.kv_canary.token_checks.history_hooks:"
                       "attach_token_history_after_init_new",
        needed=_token_history,
        purpose="snapshot the requests' origin_input_ids + output_ids (the tokens the pool "
                "lacks) for verify-token and the write-input assert's prompt tokens",
    ),
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
