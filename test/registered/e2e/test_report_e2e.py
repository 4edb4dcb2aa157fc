"""End-to-end on a GPU: the report file and the Prometheus metrics of a fault run.

A log-mode server with ``SGLANG_KV_CANARY_REPORT_PATH`` and SGLang's ``--enable-metrics`` takes
``req_to_token`` faults. Once every forward is polled:

1. the file starts with its header, and every fault's request (``rid``) has a ``violation``
   object with ``verify_position`` at the fault's step (or the next), with its forward mode and
   batch size;
2. the file's rows that are not repeats are exactly the rows the log printed, and it holds at
   least the repeats the log's last ``repeats`` line counted;
3. ``/metrics`` counts, per reason, the file's rows (repeats included), and at least one health
   check passed.
"""

import json
import re
import sys
import urllib.request

import pytest

from _workloads import PERTURB, concurrent_traffic, faults_and_rows, polled_log

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=150, suite="kv-canary-gpu")

_SERVER_ARGS = ("--enable-metrics", "--page-size", "1", "--chunked-prefill-size", "256",
                "--max-total-tokens", "6144")
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")
_SUPPRESSED_TOTAL = re.compile(r"\((\d+) suppressed in total\)")


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of counter ``name`` in a Prometheus text page."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            samples.append((labels, float(match["value"])))
    return samples


@pytest.mark.gpu
def test_the_report_file_and_the_metrics_account_for_every_fault(canary_server,
                                                                 tmp_path) -> None:
    report = tmp_path / "canary-report.jsonl"
    env = {**PERTURB, "SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "partial",
           "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "25",
           "SGLANG_KV_CANARY_REPORT_PATH": str(report),
           "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.2"}
    server = canary_server(env=env, args=_SERVER_ARGS)
    concurrent_traffic(server, rounds=6)
    log = polled_log(server)
    faults, rows = faults_and_rows(log)
    assert faults, log[-3000:]

    objects = [json.loads(line) for line in report.read_text().splitlines()]
    assert objects[0]["type"] == "header" and objects[0]["config"]["mode"] == "log"
    violations = [o for o in objects if o["type"] == "violation"]
    for fault in faults:
        step = int(fault["step"])
        assert any(v["rid"] == fault["rid"] and step <= v["step"] <= step + 1
                   and "verify_position" in v["reasons"] and v["forward_mode"] is not None
                   and (v["batch_size"] or 0) >= 1 for v in violations), fault.group(0)

    def key(check: str, req_pool_idx: int, slot: int, position: int, step: int) -> tuple:
        return (check, req_pool_idx, slot, position, step)

    printed = sorted(key(r.check.name.lower(), r.req_pool_idx, r.slot, r.position, r.step)
                     for r in rows)
    filed = sorted(key(v["check"], v["req_pool_idx"], v["slot"], v["position"], v["step"])
                   for v in violations if not v["repeat"])
    assert filed == printed
    suppressed = [int(n) for n in _SUPPRESSED_TOTAL.findall(log)]
    assert sum(v["repeat"] for v in violations) >= (suppressed[-1] if suppressed else 0)

    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as response:
        page = response.read().decode()
    by_reason: dict[str, float] = {}
    for labels, value in _samples(page, "kv_canary_violations_total"):
        assert labels["pool"] == "target"
        by_reason[labels["reason"]] = by_reason.get(labels["reason"], 0.0) + value
    expected: dict[str, float] = {}
    for v in violations:
        for reason in v["reasons"]:
            expected[reason] = expected.get(reason, 0.0) + 1
    assert by_reason == expected
    health = {labels["result"]: value
              for labels, value in _samples(page, "kv_canary_health_checks_total")}
    assert health.get("ok", 0) >= 1 and health.get("failed", 0) == 0
    assert sum(v for _, v in _samples(page, "kv_canary_slots_verified_total")) > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
