"""The report file end to end on the CPU: the real :class:`CanaryRunner` (torch reference kernels)
on the self-check's simulated server under a ``req_to_token`` fault. Every row the canary reports
is in the file, repeats included, and carries the rid, forward mode and batch size of the request
row at the row's step, as the server knew them; raise mode writes the rows it raises with; with
the knob unset nothing of the report file exists or is imported."""

import json
import pathlib
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, PerturbConfig, RealDataMode
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.monitor.violations import CanaryViolationError, find_violation_rows
from sglang.srt.kv_canary.report.__main__ import main as report_main
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.scenarios import install_canary_runner, server_hooks
from sglang.srt.kv_canary.selfcheck.simulation import (
    SimulatedModelRunner,
    default_server,
    run_mixed_workload,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="kv-canary-cpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Forward:
    mode: str
    batch_size: int
    owners: dict[int, str]  # req_pool_idx -> rid


@dataclass(slots=True, kw_only=True)
class _Run:
    runner: CanaryRunner
    forwards: list[_Forward]  # by step: what the server ran
    log: str
    error: CanaryViolationError | None


def _config(*, mode: CanaryMode, report_path: pathlib.Path | None) -> CanaryConfig:
    return CanaryConfig(
        mode=mode, real_data=RealDataMode.PARTIAL, ring_capacity=4096,
        report_path=None if report_path is None else str(report_path),
        perturb=PerturbConfig(warmup_steps=6, seed=1234, req_to_token_prob=1.0),
    )


def _run(config: CanaryConfig, caplog: pytest.LogCaptureFixture) -> _Run:
    forwards: list[_Forward] = []

    def forward(batch: object) -> object:
        forwards.append(_Forward(
            mode=batch.forward_mode.name, batch_size=batch.batch_size,
            owners=dict(zip(batch.req_pool_indices.tolist(), batch.rids)),
        ))
        return around_forward(SimulatedModelRunner.forward, server.runner, batch)

    server = default_server(page_size=4, forward=forward, hooks=server_hooks(config))
    error = None
    with caplog.at_level("INFO", logger="sglang.srt.kv_canary"):
        runner = install_canary_runner(model_runner=server.runner, config=config,
                                       kernels=load_kernels(KernelBackend.TORCH_REFERENCE))
        try:
            run_mixed_workload(server)
            runner.on_idle()
        except CanaryViolationError as exc:
            error = exc
    return _Run(runner=runner, forwards=forwards, log=caplog.text, error=error)


def _objects(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_rows_name_their_request_and_forward(rows: list[dict], forwards: list[_Forward]):
    for row in rows:
        forward = forwards[row["step"]]
        assert (row["forward_mode"], row["batch_size"]) == (forward.mode, forward.batch_size)
        assert row["rid"] == forward.owners[row["req_pool_idx"]], row


def test_log_mode_writes_every_row_with_its_rid_repeats_included(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "report.jsonl"
    run = _run(_config(mode=CanaryMode.LOG, report_path=path), caplog)
    assert run.error is None
    header, *rows = _objects(path)
    assert header["type"] == "header" and header["config"]["mode"] == "log"
    assert header["pool_description"].startswith("MHATokenToKVPool")
    assert rows and all(row["type"] == "violation" for row in rows)
    _assert_rows_name_their_request_and_forward(rows, run.forwards)
    # request rows change owners in this workload: several requests, extend and decode steps
    assert len({row["rid"] for row in rows}) > 3
    assert {row["forward_mode"] for row in rows} >= {"DECODE", "EXTEND"}
    reporter = run.runner.monitor._reporter
    assert len(rows) == reporter.rows_reported + reporter.rows_suppressed
    assert sum(row["repeat"] for row in rows) == reporter.rows_suppressed
    logged = find_violation_rows(run.log)
    printed = [row for row in rows if not row["repeat"]]
    assert [(r.step, r.req_pool_idx, r.slot, r.position) for r in logged] == [
        (r["step"], r["req_pool_idx"], r["slot"], r["position"]) for r in printed]

    assert report_main([str(path)]) == 0
    summary = capsys.readouterr().out
    assert f"{len(rows)} violation row(s)" in summary and "verify_position" in summary
    assert rows[0]["rid"] in summary


def test_raise_mode_writes_the_rows_it_raises_with(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "report.jsonl"
    run = _run(_config(mode=CanaryMode.RAISE, report_path=path), caplog)
    assert run.error is not None
    _, *rows = _objects(path)
    assert [(row["step"], row["slot"], row["position"]) for row in rows] == [
        (row.step, row.slot, row.position) for row in run.error.rows]
    assert not any(row["repeat"] for row in rows)
    _assert_rows_name_their_request_and_forward(rows, run.forwards)


def test_without_the_knob_there_is_no_history_and_no_owner_list(
    caplog: pytest.LogCaptureFixture
) -> None:
    run = _run(_config(mode=CanaryMode.LOG, report_path=None), caplog)
    assert run.runner._forward_history is None
    assert run.runner.monitor._reporter._sink is None


_IMPORTS_WITHOUT_THE_KNOB = """
    import sys
    from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
    from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
    from sglang.srt.kv_canary.selfcheck.scenarios import install_canary_runner
    from sglang.srt.kv_canary.selfcheck.simulation import default_server
    server = default_server(page_size=4, forward=lambda batch: None)
    install_canary_runner(model_runner=server.runner, config=CanaryConfig(mode=CanaryMode.LOG),
                          kernels=load_kernels(KernelBackend.TORCH_REFERENCE))
    loaded = [name for name in sys.modules if name.startswith(
        ("sglang.srt.kv_canary.report", "sglang.srt.kv_canary.monitor.report_file",
         "sglang.srt.kv_canary.monitor.forward_history"))]
    print("LOADED:" + ",".join(loaded))
"""


def test_without_the_knob_nothing_of_the_report_file_is_imported() -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_IMPORTS_WITHOUT_THE_KNOB)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "LOADED:"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
