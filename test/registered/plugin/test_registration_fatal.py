"""Hook registration is all or nothing, and fatal: an adapter module that cannot be imported stops
``activate()`` with a :class:`CanaryStartupError` before any hook is registered, and
``ModelRunner.initialize``'s check (:func:`verify_hooks_applied`) refuses a configuration whose
hooks are not in place even when nothing at all was registered."""

import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from sglang.srt.kv_canary import hooks
from sglang.srt.kv_canary.config import (
    CanaryConfig,
    CanaryMode,
    parse_config,
    set_active_config_for_testing,
)
from sglang.srt.kv_canary.hook_registration import HookRegistrationError, verify_hooks_applied
from sglang.srt.kv_canary.hook_targets import HOOK_SPECS, select_hook_specs
from sglang.srt.kv_canary.plugin import CanaryStartupError, activate
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="kv-canary-cpu")

# Canary in abort mode, oracle, radix sweep and a host-tier fault on (the padded-row bug not
# re-injected): every hook of the table is needed, so every adapter module is imported.
_EVERYTHING = {
    "SGLANG_KV_CANARY_MODE": "abort",
    "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
    "SGLANG_KV_CANARY_SWEEP_INTERVAL": "16",
    "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
    "SGLANG_KV_CANARY_PERTURB_LOAD_SHIFT_PROB": "0.5",
}
ADAPTER_MODULES = sorted(
    f"{hooks.__name__}.{info.name}" for info in pkgutil.iter_modules(hooks.__path__)
)


def test_every_adapter_module_is_used_by_the_table_and_needed_by_the_full_configuration() -> None:
    used = {spec.adapter.partition(":")[0] for spec in HOOK_SPECS}
    assert used == set(ADAPTER_MODULES)
    # the command line's canary flags add the one hook that makes launch_server parse them
    assert select_hook_specs(parse_config(_EVERYTHING, argv=["--kv-canary", "abort"])) == HOOK_SPECS


def test_the_scheduler_cache_hook_of_the_sweep_is_needed_only_with_the_sweep() -> None:
    """The radix sweep attaches to the scheduler's tree cache; without the sweep that adapter
    is not registered (the host tier's, on the same target, is: it attaches when the scheduler
    built a hierarchical cache)."""
    adapter = "sglang.srt.kv_canary.hooks.scheduler:after_init_cache"
    without_sweep = {**{k: v for k, v in _EVERYTHING.items() if "SWEEP" not in k},
                     "SGLANG_KV_CANARY_MODE": "log"}  # (abort mode's containment needs it too)
    assert adapter in {spec.adapter for spec in select_hook_specs(parse_config(_EVERYTHING))}
    selected = select_hook_specs(parse_config(without_sweep))
    assert adapter not in {spec.adapter for spec in selected}
    assert "sglang.srt.kv_canary.hooks.host_tier:attach_host_tier" in {
        spec.adapter for spec in selected}


def test_the_sample_hook_is_needed_only_with_a_token_check() -> None:
    """The sampled tokens join the token history, which only the token checks read."""
    target = "sglang.srt.model_executor.model_runner.ModelRunner.sample"
    without_checks = {k: v for k, v in _EVERYTHING.items() if "VERIFY_TOKEN" not in k}
    assert target in {spec.target for spec in select_hook_specs(parse_config(_EVERYTHING))}
    assert target not in {spec.target for spec in select_hook_specs(parse_config(without_checks))}


def test_the_padded_row_fix_is_not_needed_while_the_bug_is_reinjected() -> None:
    target = (
        "sglang.srt.model_executor.cuda_graph_runner.DecodeInputBuffers."
        "populate_from_forward_batch"
    )
    reinjected = {**_EVERYTHING, "SGLANG_KV_CANARY_REINJECT_PADDED_ROW_BUG": "1"}
    assert target in {spec.target for spec in select_hook_specs(parse_config(_EVERYTHING))}
    assert target not in {spec.target for spec in select_hook_specs(parse_config(reinjected))}


@pytest.fixture
def everything_enabled(monkeypatch: pytest.MonkeyPatch):
    """The full configuration in the environment, a fresh config cache, and a recorder in place
    of ``HookRegistry.register``."""
    for name, value in _EVERYTHING.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["launch_server"])
    registered: list[str] = []
    monkeypatch.setattr(HookRegistry, "register",
                        classmethod(lambda cls, target, *a, **k: registered.append(target)))
    hooks_before = {target: list(entries) for target, entries in HookRegistry._hooks.items()}
    set_active_config_for_testing(None)
    yield registered
    set_active_config_for_testing(None)
    assert {t: list(e) for t, e in HookRegistry._hooks.items() if e} == {
        t: e for t, e in hooks_before.items() if e
    }


@pytest.mark.parametrize("module", ADAPTER_MODULES)
def test_an_adapter_module_that_is_missing_stops_activation_and_registers_nothing(
    module: str, everything_enabled: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # "import module" now fails
    with pytest.raises(CanaryStartupError) as info:
        activate()
    message = str(info.value.code)
    assert message.startswith("[kv_canary] start-up refused: HookRegistrationError")
    assert module in message and "cannot be loaded" in message
    assert everything_enabled == []


@pytest.mark.parametrize("module", ADAPTER_MODULES)
def test_an_adapter_module_that_raises_on_import_stops_activation_and_registers_nothing(
    module: str, everything_enabled: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = importlib.import_module

    def import_module(name: str, package: str | None = None):
        if name == module:
            raise RuntimeError(f"simulated failure importing {name}")
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(CanaryStartupError) as info:
        activate()
    assert f"simulated failure importing {module}" in str(info.value.code)
    assert everything_enabled == []


def test_any_failure_while_registering_is_a_startup_error(
    everything_enabled: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(config: CanaryConfig) -> None:
        raise KeyError("unexpected")

    monkeypatch.setattr("sglang.srt.kv_canary.hook_registration.register_hooks", broken)
    with pytest.raises(CanaryStartupError, match="KeyError"):
        activate()


def test_a_missing_adapter_stops_sglangs_own_loader_without_a_traceback() -> None:
    """Through SGLang's plugin loader, which only logs a plugin's ``Exception``: the
    ``SystemExit`` passes it, and the process stops with one line."""
    code = textwrap.dedent("""
        import sys
        sys.modules["sglang.srt.kv_canary.hooks.forward_batch"] = None
        from sglang.srt.plugins import load_plugins
        load_plugins()
        print("STILL RUNNING")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_KV_CANARY_")}
    result = subprocess.run([sys.executable, "-c", code], env={**env, **_EVERYTHING},
                            capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "STILL RUNNING" not in output
    assert "start-up refused" in output and "hooks.forward_batch" in output
    assert "Traceback" not in output


def test_needed_hooks_are_checked_even_when_nothing_was_registered() -> None:
    """Nothing of ours wraps SGLang in this process (registration skipped): the check of the
    configuration's needs fails and names every needed target."""
    config = parse_config(_EVERYTHING)
    assert not any(
        "kv_canary" in getattr(hook, "__module__", "")
        for entries in HookRegistry._hooks.values()
        for _, hook, _ in entries
    )
    with pytest.raises(HookRegistrationError) as info:
        verify_hooks_applied(config)
    for spec in select_hook_specs(config):
        assert spec.target in str(info.value)


def test_a_configuration_that_needs_no_hook_passes_the_check() -> None:
    verify_hooks_applied(CanaryConfig(mode=CanaryMode.NONE))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
