"""The server launcher (``sglang.srt.kv_canary.tools.server``): validation, command line,
environment, and the whole lifecycle against a stand-in server (``fake_sglang_server.py``):
bounded readiness, requests, early exit, timeouts, and killing the whole process group."""

import pathlib
import sys
import time

import pytest

from sglang.srt.kv_canary.tools.server import (
    HOST,
    TINY_MODEL_SERVER_ARGS,
    ServerLaunch,
    ServerRequestError,
    ServerStartError,
    free_port,
    run_until_exit,
    start_server,
)
from sglang.srt.kv_canary.tools.tiny_model import make_tiny_model
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="kv-canary-cpu")

_HERE = pathlib.Path(__file__).resolve().parent


def _fake_launch(tmp_path: pathlib.Path, **overrides) -> ServerLaunch:
    env = {"PYTHONPATH": str(_HERE), **overrides.pop("env", {})}
    settings = dict(model_dir=tmp_path, log_path=tmp_path / "logs" / "server.log", env=env,
                    server_module="fake_sglang_server", ready_timeout_s=30.0,
                    request_timeout_s=10.0, stop_timeout_s=5.0)
    settings.update(overrides)
    return ServerLaunch(**settings)


def _alive(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "overrides,fragment",
    [
        ({"model_dir": "/no/such/model"}, "model_dir='/no/such/model'"),
        ({"port": 0}, "port=0"),
        ({"port": 70000}, "port=70000"),
        ({"args": ("--port", "1")}, "'--port' is set by the launcher"),
        ({"args": ("--host=0.0.0.0",)}, "'--host=0.0.0.0' is set by the launcher"),
        ({"args": ("--model-path", "x")}, "'--model-path' is set by the launcher"),
        ({"args": (3,)}, "argument 3 is invalid"),
        ({"ready_timeout_s": 0}, "ready_timeout_s=0"),
        ({"stop_timeout_s": -1.0}, "stop_timeout_s=-1.0"),
        ({"env": {"A": 1}}, "env['A']=1"),
    ],
)
def test_invalid_launch_is_rejected_with_the_field_named(tmp_path, overrides, fragment) -> None:
    settings = {"model_dir": tmp_path, "log_path": tmp_path / "s.log", **overrides}
    with pytest.raises(ValueError) as error:
        ServerLaunch(**settings)
    assert fragment in str(error.value)


def test_command_line_listens_on_loopback_with_tiny_defaults_then_extra_args(tmp_path) -> None:
    launch = ServerLaunch(model_dir=tmp_path, log_path=tmp_path / "s.log",
                          args=("--sampling-backend", "token_oracle"))
    command = launch.command(port=31234)
    assert command[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert command[3:9] == ["--model-path", str(tmp_path), "--host", HOST, "--port", "31234"]
    assert HOST == "127.0.0.1"
    assert command[9:] == [*TINY_MODEL_SERVER_ARGS, "--sampling-backend", "token_oracle"]
    assert "--load-format" in TINY_MODEL_SERVER_ARGS and "dummy" in TINY_MODEL_SERVER_ARGS


def test_the_nccl_port_is_passed_and_every_picked_port_is_below_the_ephemeral_range(
    tmp_path,
) -> None:
    launch = ServerLaunch(model_dir=tmp_path, log_path=tmp_path / "s.log")
    command = launch.command(port=21000, nccl_port=12345)
    assert command[9:11] == ["--nccl-port", "12345"] and not launch.sets_nccl_port
    assert "--nccl-port" not in launch.command(port=21000)
    assert ServerLaunch(model_dir=tmp_path, log_path=tmp_path / "s.log",
                        args=("--nccl-port=999",)).sets_nccl_port
    http = free_port()
    assert 20000 <= http and http + 10000 < 32768  # its derived gRPC port too
    assert 10000 <= free_port(candidates=range(10000, 20000), offsets=(0,)) < 20000


def test_environment_drops_inherited_canary_variables_unless_asked(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_KV_CANARY_MODE", "raise")
    monkeypatch.setenv("SGLANG_KV_CANARY_REAL_DATA", "all")
    monkeypatch.setenv("SOME_OTHER_SETTING", "kept")
    isolated = ServerLaunch(model_dir=tmp_path, log_path=tmp_path / "s.log",
                            env={"SGLANG_KV_CANARY_MODE": "log"}).child_environment()
    assert isolated["SGLANG_KV_CANARY_MODE"] == "log"
    assert "SGLANG_KV_CANARY_REAL_DATA" not in isolated
    assert isolated["SOME_OTHER_SETTING"] == "kept" and isolated["PYTHONUNBUFFERED"] == "1"
    inherited = ServerLaunch(model_dir=tmp_path, log_path=tmp_path / "s.log",
                             inherit_canary_env=True,
                             env={"SGLANG_KV_CANARY_MODE": "log"}).child_environment()
    assert inherited["SGLANG_KV_CANARY_MODE"] == "log"  # explicit env wins
    assert inherited["SGLANG_KV_CANARY_REAL_DATA"] == "all"


# ----------------------------------------------------------------------------- lifecycle
def test_serves_requests_and_stop_kills_the_whole_process_group(tmp_path) -> None:
    child_pid_file = tmp_path / "child.pid"
    launch = _fake_launch(tmp_path, env={"FAKE_SERVER_READY_DELAY_S": "1.5",
                                         "FAKE_SERVER_CHILD_PID_FILE": str(child_pid_file)})
    with start_server(launch) as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        assert server.wait_ready() >= 1.0  # /health answered 503 first
        one = server.generate({"text": "abc", "rid": "r1",
                               "sampling_params": {"max_new_tokens": 3}})
        assert one == {"text": "ABC", "rid": "r1", "meta_info": {"completion_tokens": 3}}
        batch = server.generate({"text": ["a", "b"]})
        assert [item["text"] for item in batch] == ["A", "B"]
        many = server.generate_many([{"text": f"t{i}"} for i in range(12)], concurrency=4)
        assert [item["text"] for item in many] == [f"T{i}" for i in range(12)]
        assert server.flush_cache() is True
        server.abort("r1")
        assert server.request_json("GET", "/aborted") == ["r1"]
        with pytest.raises(ServerRequestError, match="answered 400"):
            server.generate({"text": "x", "fail": True})
        assert "KV canary enabled: mode=log (fake)" in server.log_text()
        assert server.log_text().startswith("[kv_canary.tools.server] command: ")
        child_pid = int(child_pid_file.read_text())
        assert _alive(child_pid) and server.returncode is None
    assert server.returncode is not None
    assert not _alive(child_pid)  # the group went down with the launcher
    assert server.stop() == server.returncode  # idempotent


def test_exit_before_ready_raises_with_the_log_tail(tmp_path) -> None:
    server = start_server(_fake_launch(tmp_path, env={"FAKE_SERVER_MODE": "exit"}))
    try:
        with pytest.raises(ServerStartError) as error:
            server.wait_ready()
    finally:
        server.stop()
    assert "exited with code 3 before it was ready" in str(error.value)
    assert "FAKE_SETTING='bad' is invalid" in str(error.value)


def test_not_ready_in_time_raises_and_stop_escalates_to_sigkill(tmp_path) -> None:
    launch = _fake_launch(tmp_path, stop_timeout_s=1.0,
                          env={"FAKE_SERVER_MODE": "hang", "FAKE_SERVER_IGNORE_SIGTERM": "1"})
    server = start_server(launch)
    try:
        with pytest.raises(ServerStartError, match="not ready after 2 s"):
            server.wait_ready(2.0)
    finally:
        started = time.monotonic()
        server.stop()
    assert time.monotonic() - started < 15
    assert server.returncode == -9  # SIGTERM was ignored: killed


def test_run_until_exit_returns_the_code_and_output(tmp_path) -> None:
    outcome = run_until_exit(_fake_launch(tmp_path, env={"FAKE_SERVER_MODE": "exit"}), timeout_s=30)
    assert outcome.returncode == 3
    assert "FAKE_SETTING='bad' is invalid; allowed: good" in outcome.output
    assert 0 < outcome.elapsed_s < 30


def test_run_until_exit_kills_a_launch_that_keeps_running(tmp_path) -> None:
    launch = _fake_launch(tmp_path, env={"FAKE_SERVER_MODE": "hang"})
    with pytest.raises(TimeoutError, match="still ran after 2 s"):
        run_until_exit(launch, timeout_s=2)


def test_real_launcher_refuses_a_bad_mode_in_its_cli_process(tmp_path) -> None:
    """``python -m sglang.launch_server`` itself stops before needing a device (also on CPU)."""
    launch = ServerLaunch(model_dir=make_tiny_model(directory=tmp_path / "model"),
                          log_path=tmp_path / "launch.log", env={"SGLANG_KV_CANARY_MODE": "loud"})
    outcome = run_until_exit(launch, timeout_s=240)
    assert outcome.returncode != 0
    assert ("[kv_canary] start-up refused: SGLANG_KV_CANARY_MODE='loud' is invalid; allowed: "
            "none, log, abort, raise") in outcome.output
    assert "Load weight" not in outcome.output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
