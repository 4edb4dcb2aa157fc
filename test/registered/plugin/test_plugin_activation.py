"""Activation through SGLang's plugin loader, each case in a fresh interpreter.

Needs the package installed (``pip install .``): the entry point must be visible to
``importlib.metadata``.
"""

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="kv-canary-cpu")


def _clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_KV_CANARY_")}
    env.update(overrides)
    return env


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


_PROBE = """
    import json, sys
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    before = set(sys.modules)
    load_plugins()
    ours = sorted(m for m in set(sys.modules) - before if "kv_canary" in m)
    hooks = {t: [getattr(h, "__module__", "") for _, h, _ in v] for t, v in HookRegistry._hooks.items()}
    print(json.dumps({"ours": ours, "hooks": hooks, "torch_new": "torch" in set(sys.modules) - before}))
"""


def _probe(**env: str) -> dict:
    result = _run(_PROBE, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_entry_point_is_registered() -> None:
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "kv_canary"]
    assert len(eps) == 1
    assert eps[0].value == "sglang.srt.kv_canary.plugin:activate"
    assert eps[0].dist is not None and eps[0].dist.name == "sglang-kv-canary"


def test_disabled_registers_nothing_and_imports_only_config() -> None:
    state = _probe()
    our_hooks = {t: m for t, m in state["hooks"].items() if any("kv_canary" in x for x in m)}
    assert our_hooks == {}
    assert set(state["ours"]) <= {
        "sglang.srt.kv_canary", "sglang.srt.kv_canary.plugin", "sglang.srt.kv_canary.config"
    }
    assert state["torch_new"] is False


def test_enabled_registers_hooks() -> None:
    state = _probe(SGLANG_KV_CANARY_MODE="log")
    our_targets = {t for t, m in state["hooks"].items() if any("kv_canary" in x for x in m)}
    assert "sglang.srt.model_executor.model_runner.ModelRunner.initialize" in our_targets
    assert "sglang.srt.managers.scheduler.Scheduler.__init__" in our_targets


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"SGLANG_KV_CANARY_MODE": "loud"}, ["SGLANG_KV_CANARY_MODE", "'loud'", "none, log, abort, raise"]),
        ({"SGLANG_KV_CANARY_MDOE": "log"}, ["SGLANG_KV_CANARY_MDOE", "SGLANG_KV_CANARY_MODE"]),
        ({"SGLANG_KV_CANARY_RING_CAPACITY": "0", "SGLANG_KV_CANARY_MODE": "log"},
         ["SGLANG_KV_CANARY_RING_CAPACITY", "'0'"]),
    ],
)
def test_bad_configuration_exits_non_zero_with_message(env: dict, expected: list[str]) -> None:
    result = _run("from sglang.srt.plugins import load_plugins; load_plugins()", **env)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for fragment in expected:
        assert fragment in output, output[-2000:]
    assert "Traceback" not in output  # a short message, not a stack dump


def test_missing_hook_target_stops_with_target_and_version() -> None:
    code = """
        import dataclasses
        from sglang.srt.kv_canary import hook_targets
        spec = next(s for s in hook_targets.HOOK_SPECS if s.target.endswith("Scheduler.__init__"))
        broken = dataclasses.replace(
            spec, target="sglang.srt.managers.scheduler.Scheduler.no_such_method")
        hook_targets.HOOK_SPECS = (broken,)
        from sglang.srt.plugins import load_plugins
        load_plugins()
    """
    result = _run(code, SGLANG_KV_CANARY_MODE="log")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Scheduler.no_such_method" in output and "0.5.12.post1" in output


def test_unapplied_hook_is_detected() -> None:
    code = """
        import json
        from sglang.srt.plugins import load_plugins
        from sglang.srt.kv_canary.config import get_active_config
        from sglang.srt.kv_canary.hook_registration import (
            HookRegistrationError, verify_hooks_applied)

        def missing():
            try:
                verify_hooks_applied(get_active_config())
            except HookRegistrationError as exc:
                return str(exc)
            return ""

        load_plugins()
        before = missing()
        from sglang.srt.model_executor.model_runner import ModelRunner
        ModelRunner.initialize = ModelRunner.initialize.__wrapped__   # undo one hook
        print(json.dumps({"before": before, "after": missing()}))
    """
    result = _run(code, SGLANG_KV_CANARY_MODE="log")
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads(result.stdout.strip().splitlines()[-1])
    # (On a CPU machine the scheduler's hooks cannot apply: its module imports CUDA libraries.)
    assert "ModelRunner.initialize" not in state["before"]
    assert "ModelRunner.initialize" in state["after"]


def test_oracle_backend_without_oracle_is_refused() -> None:
    code = """
        import sys
        sys.argv = ["launch_server", "--sampling-backend", "token_oracle"]
        from sglang.srt.plugins import load_plugins
        load_plugins()
    """
    result = _run(code)
    assert result.returncode != 0
    assert "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1" in result.stdout + result.stderr



def test_a_launch_flag_turns_the_canary_on_and_launch_server_parses_it() -> None:
    """``--kv-canary log`` on the command line alone: the canary's hooks are registered (the
    flag parser's among them), and SGLang's own parser accepts the flags."""
    code = """
        import json, sys
        sys.argv = ["launch_server", "--model-path", "m", "--kv-canary", "log",
                    "--kv-canary-real-data", "partial"]
        from sglang.srt.plugins import load_plugins
        from sglang.srt.plugins.hook_registry import HookRegistry
        load_plugins()
        import argparse
        from sglang.srt.server_args import ServerArgs
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        args = parser.parse_args(sys.argv[1:])
        from sglang.srt.kv_canary.config import get_active_config
        config = get_active_config()
        print(json.dumps({"mode": config.mode.value, "real_data": config.real_data.value,
                          "flag": args.kv_canary, "targets": sorted(HookRegistry._hooks)}))
    """
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads(result.stdout.strip().splitlines()[-1])
    assert (state["mode"], state["real_data"], state["flag"]) == ("log", "partial", "log")
    assert "sglang.srt.model_executor.model_runner.ModelRunner.initialize" in state["targets"]


def test_launch_server_help_lists_the_flags_with_the_canary_off() -> None:
    result = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"],
                            env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "KV canary:" in result.stdout
    for flag in ("--kv-canary VALUE", "--kv-canary-real-data VALUE",
                 "--kv-canary-sweep-interval VALUE", "--kv-canary-report-path VALUE"):
        assert flag in result.stdout


def test_a_flag_disagreeing_with_its_variable_stops_the_launch() -> None:
    code = """
        import sys
        sys.argv = ["launch_server", "--kv-canary", "raise"]
        from sglang.srt.plugins import load_plugins
        load_plugins()
    """
    result = _run(code, SGLANG_KV_CANARY_MODE="log")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "--kv-canary raise and SGLANG_KV_CANARY_MODE='log' disagree" in output, output[-2000:]


def test_with_the_oracle_on_the_sampling_backend_defaults_to_it() -> None:
    code = """
        import argparse, json, sys
        sys.argv = ["launch_server", "--model-path", "m"]
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.server_args import ServerArgs
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        default = parser.parse_args(["--model-path", "m"]).sampling_backend
        given = parser.parse_args(["--model-path", "m", "--sampling-backend", "pytorch"])
        print(json.dumps([default, given.sampling_backend]))
    """
    result = _run(code, SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["token_oracle", "pytorch"]


def test_the_startup_line_names_the_sampling_backend_with_the_oracle(caplog) -> None:
    import logging
    from types import SimpleNamespace

    from sglang.srt.kv_canary.config import parse_config, set_active_config_for_testing
    from sglang.srt.kv_canary.hooks.scheduler import log_startup_line

    set_active_config_for_testing(parse_config({"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}))
    try:
        with caplog.at_level(logging.INFO, logger="sglang.srt.kv_canary"):
            log_startup_line(object(), SimpleNamespace(sampling_backend="token_oracle"))
    finally:
        set_active_config_for_testing(None)
    line = caplog.records[-1].getMessage()
    assert line.startswith("KV canary enabled: mode=none") and line.endswith(
        "sampling_backend=token_oracle"), line

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
