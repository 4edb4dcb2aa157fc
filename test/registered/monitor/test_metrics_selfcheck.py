"""The prometheus metrics end to end on the CPU: the real :class:`CanaryRunner` (torch reference
kernels) on the self-check's simulated server with ``--enable-metrics`` under a ``req_to_token``
fault, in a fresh interpreter with its own ``PROMETHEUS_MULTIPROC_DIR``. The violation counters
match the rows of the report file (repeats included) reason by reason, the slot verifications
match the newest snapshot the monitor read, and every health check that passed is counted."""

import collections
import json
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

from _prometheus import read_metrics, run_fresh, value

register_cpu_ci(est_time=60, suite="kv-canary-cpu")

_SERVE = """
    import dataclasses, json, logging
    from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, PerturbConfig, RealDataMode
    from sglang.srt.kv_canary.hooks.model_runner import around_forward
    from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX
    from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
    from sglang.srt.kv_canary.selfcheck.scenarios import install_canary_runner, server_hooks
    from sglang.srt.kv_canary.selfcheck.simulation import (
        SimulatedModelRunner, default_server, run_mixed_workload)

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("sglang.srt.kv_canary").addHandler(handler)
    logging.getLogger("sglang.srt.kv_canary").setLevel(logging.INFO)
    config = CanaryConfig(
        mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL, ring_capacity=4096,
        report_path={report_path!r}, health_check_every_n_steps=5,
        perturb=PerturbConfig(warmup_steps=6, seed=1234, req_to_token_prob=1.0),
    )
    server = default_server(
        page_size=4, hooks=server_hooks(config),
        forward=lambda batch: around_forward(SimulatedModelRunner.forward, server.runner, batch))
    server.runner.server_args = dataclasses.replace(
        server.runner.server_args, enable_metrics=True, served_model_name="sim")
    runner = install_canary_runner(model_runner=server.runner, config=config,
                                   kernels=load_kernels(KernelBackend.TORCH_REFERENCE))
    run_mixed_workload(server)
    runner.on_idle()
    reporter = runner.monitor._reporter
    print(json.dumps(dict(
        slots_verified=runner.monitor.latest.slots_verified, dropped=reporter.rows_dropped,
        suppressed=reporter.rows_suppressed,
        health_ok=sum(m.startswith(HEALTH_OK_PREFIX) for m in messages),
        installed=[m for m in messages if m.startswith("KV canary installed")])))
"""


def test_the_counters_match_the_violation_rows_snapshots_and_health_checks(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, report = tmp_path / "prometheus", tmp_path / "report.jsonl"
    out = run_fresh(_SERVE.format(report_path=str(report)), directory=directory,
                    monkeypatch=monkeypatch)
    result = json.loads(out.strip().splitlines()[-1])
    assert "prometheus metrics kv_canary_*" in result["installed"][0]
    rows = [obj for obj in map(json.loads, report.read_text().splitlines())
            if obj["type"] == "violation"]
    assert rows and result["suppressed"] > 0  # repeats happened and are counted too
    expected = collections.Counter(
        (row["check"], reason) for row in rows for reason in row["reasons"])
    samples = read_metrics(directory)
    base = dict(model_name="sim", engine_type="unified", tp_rank="0", pool="target")
    counted = {
        (dict(labels)["check"], dict(labels)["reason"]): count
        for (name, labels), count in samples.items() if name == "kv_canary_violations_total"
    }
    assert counted == dict(expected)
    assert value(samples, "kv_canary_ring_dropped_total", **base) == result["dropped"] == 0
    verified = value(samples, "kv_canary_slots_verified_total", **base)
    assert verified == result["slots_verified"] > 0
    assert result["health_ok"] > 0
    assert value(samples, "kv_canary_health_checks_total", **base, result="ok") \
        == result["health_ok"]
    assert value(samples, "kv_canary_health_checks_total", **base, result="failed") == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
