"""``benchmark/bench_server.py`` end to end against ``fake_sglang_server.py`` (a stand-in for
``sglang.launch_server`` that logs what a server of its configuration logs): every server starts
at once and is measured in interleaved rounds, the result set is written (ratios to stock paired
by round, the canary's own cost, targets, server statuses), and a canary violation or a server
that does not start is a PROBLEM with exit status 1."""

import contextlib
import json
import os
import pathlib
import sys
import time

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[2] / "benchmark"))

import bench_server  # noqa: E402
from harness.configs import CONFIGS  # noqa: E402
from harness.deadline import Deadline  # noqa: E402
from harness.models import MODELS  # noqa: E402
from harness.servers import ServerSpec, start_servers  # noqa: E402


@pytest.fixture
def fake_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers of this process's runs are the stand-in, logging as configured."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, (str(_HERE), os.environ.get("PYTHONPATH", "")))))
    monkeypatch.setenv("FAKE_SERVER_AS_CONFIGURED", "1")
    monkeypatch.setenv("FAKE_SERVER_DECODE_DELAY_S", "0.002")


def _run(tmp_path: pathlib.Path, *extra: str, models: str = "tiny") -> int:
    return bench_server.main(["--models", models, "--workloads", "ttft1,decode1",
                              "--max-rounds", "2", "--time-budget-s", "200",
                              "--server-module", "fake_sglang_server",
                              "--out", str(tmp_path / "out"), "--log-dir", str(tmp_path / "logs"),
                              *extra])


def test_every_configuration_is_measured_against_stock(
        tmp_path: pathlib.Path, fake_servers: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path) == 0
    document = json.loads((tmp_path / "out" / "server-tiny.json").read_text())
    text = (tmp_path / "out" / "server-tiny.txt").read_text()
    assert document["problems"] == [] and "PROBLEM" not in text
    assert document["interleaving"]["sweeps"] == 2
    assert list(document["configs"]) == ["stock", "off", "off+flags", "canary", "all-checks"]
    for workload in ("ttft1", "decode1"):
        cells = document["table"][workload]
        assert cells["stock"]["vs_stock"]["median"] == 1.0
        for name in ("off", "off+flags", "canary", "all-checks"):
            assert cells[name]["vs_stock"]["samples"] == 2
        assert cells["canary"]["vs_off+flags"]["samples"] == 2
        assert cells["off"]["vs_off+flags"] is None
        assert sorted(document["rounds"]["canary"][workload]) == ["1", "2"]
    servers = {server["label"]: server for server in document["servers"]}
    assert servers["tiny/stock"]["log"]["plugin"] == "not loaded"
    assert servers["tiny/stock"]["log"]["piecewise_cuda_graph"]
    assert not servers["tiny/off+flags"]["log"]["piecewise_cuda_graph"]
    assert servers["tiny/all-checks"]["log"]["canary_running"]
    assert "--disable-piecewise-cuda-graph" in servers["tiny/canary"]["command"]
    assert "--disable-piecewise-cuda-graph" not in servers["tiny/off"]["command"]
    lines = text.splitlines()
    assert any(line.split()[:2] == ["workload", "metric"] and line.split()[-1] == "all-checks"
               for line in lines)
    assert any(line.strip().startswith("all-checks ttft1 <= 1.05x:") for line in lines)
    assert "the canary's own cost" in text and text in capsys.readouterr().out


def test_the_sliding_window_model_is_served_as_a_gpt_oss_on_the_hybrid_pool(
        tmp_path: pathlib.Path, fake_servers: None) -> None:
    # the stand-in logs SGLang's hybrid pool line only for a config.json with sliding-window
    # layers: the run wrote tiny-swa's directory with make_tiny_gpt_oss
    assert _run(tmp_path, models="tiny-swa") == 0
    document = json.loads((tmp_path / "out" / "server-tiny-swa.json").read_text())
    text = (tmp_path / "out" / "server-tiny-swa.txt").read_text()
    assert document["problems"] == [] and "PROBLEM" not in text
    assert document["shape"]["architecture"] == "gpt_oss"
    assert document["shape"]["sliding_window"] == 128
    assert text.startswith("server-tiny-swa: gpt_oss (MoE), 4 layers: 2 sliding-window")
    assert len(document["servers"]) == len(CONFIGS)
    for server in document["servers"]:
        command = server["command"]
        assert command[command.index("--moe-runner-backend") + 1] == "triton", server["label"]
        assert server["pool"]["kv_tokens"] == 46080 and server["pool"]["swa_kv_tokens"] == 36864
        assert pathlib.Path(command[command.index("--model-path") + 1]).name == "tiny-swa"
    assert "stock: stopped" in text and "KV pool 46080 tokens, SWA pool 36864 tokens" in text
    for workload in ("ttft1", "decode1"):
        assert document["table"][workload]["all-checks"]["vs_stock"]["samples"] == 2


def test_a_canary_violation_is_a_problem(tmp_path: pathlib.Path, fake_servers: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SERVER_VIOLATIONS", "1")
    assert _run(tmp_path, "--configs", "stock,canary") == 1
    text = (tmp_path / "out" / "server-tiny.txt").read_text()
    assert text.startswith("!!! PROBLEM: tiny/canary: ")
    assert "canary violation lines" in text.splitlines()[0]


def test_a_server_that_does_not_start_is_a_problem(tmp_path: pathlib.Path, fake_servers: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SERVER_MODE", "exit")
    assert _run(tmp_path, "--configs", "stock,canary") == 1
    document = json.loads((tmp_path / "out" / "server-tiny.json").read_text())
    assert any("tiny/stock: refused: " in problem for problem in document["problems"])
    assert any("stock measured no round" in problem for problem in document["problems"])
    assert document["interleaving"]["stopped"] == "no participant"


def _state(pid: int, *, becomes: str) -> str:
    """The process state letter of ``pid`` once it is ``becomes`` (signals land
    asynchronously), or the last one read after 5 s."""
    deadline = time.monotonic() + 5.0
    while True:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        state = stat[stat.rindex(")") + 2]
        if state == becomes or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_a_paused_server_is_stopped_until_resumed(tmp_path: pathlib.Path,
                                                  fake_servers: None) -> None:
    with contextlib.ExitStack() as stack:
        (entry,) = start_servers([ServerSpec(model=MODELS["tiny"], config=CONFIGS["off"])],
                                 model_dirs={"tiny": tmp_path}, log_dir=tmp_path / "logs",
                                 machine_args=(), stack=stack,
                                 server_module="fake_sglang_server")
        entry.wait_ready(deadline=Deadline.after(30.0))
        assert entry.live
        entry.pause()
        assert _state(entry.server.pid, becomes="T") == "T"
        entry.resume()
        assert _state(entry.server.pid, becomes="S") != "T" and entry.server.flush_cache()
        entry.pause()  # stop() continues it first, so SIGTERM ends it
    assert entry.status == "stopped" and entry.server.returncode is not None


def test_defaults_fit_one_device_call() -> None:
    args = bench_server.parse_args([])
    assert args.time_budget_s == 540.0 and args.models == ("tiny", "8b")
    assert bench_server.parse_args(["--models", "tiny-swa"]).models == ("tiny-swa",)
    assert args.machine_args == ["--attention-backend", "triton", "--sampling-backend",
                                 "pytorch", "--grammar-backend", "none"]
    assert bench_server.parse_args(["--machine-args", ""]).machine_args == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
