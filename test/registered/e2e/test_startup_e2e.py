"""End-to-end: a real ``python -m sglang.launch_server`` with the plugin installed, on the tiny
dummy-weight model (fixtures from ``e2e_fixtures.py``).

Proves: with ``SGLANG_KV_CANARY_MODE=log`` the server serves and its scheduler logs the start-up
line; a bad mode stops the launch fast, before any model loading, with the variable, the value
and the allowed values; with the canary off the log never mentions it; the tiny EAGLE draft is
accepted by ``--speculative-algorithm EAGLE``.
"""

import sys

import pytest

from sglang.srt.kv_canary.tools.canary_log import parse_canary_log
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="kv-canary-gpu")

_NEW_TOKENS = 12


def _payload(index: int) -> dict:
    return {
        "text": f"Request {index}: " + " ".join(["attention cache page"] * (3 + index % 20)),
        "rid": f"foundation-{index}",
        "sampling_params": {"max_new_tokens": _NEW_TOKENS, "temperature": 0.0,
                            "ignore_eos": True},
    }


def _serve_a_batch(server) -> list[dict]:
    """Concurrent single requests, then one batched request: every one completes in full."""
    outputs = server.generate_many([_payload(i) for i in range(24)], concurrency=8)
    batch = server.generate({
        "text": [f"batched prompt {i} about the radix cache" for i in range(8)],
        "sampling_params": {"max_new_tokens": _NEW_TOKENS, "temperature": 0.0,
                            "ignore_eos": True},
    })
    assert isinstance(batch, list) and len(batch) == 8
    for output in outputs + batch:
        assert output["meta_info"]["completion_tokens"] == _NEW_TOKENS, output["meta_info"]
    return outputs + batch


@pytest.mark.gpu
def test_log_mode_serves_and_logs_the_startup_line(canary_server) -> None:
    server = canary_server(env={"SGLANG_KV_CANARY_MODE": "log"})
    _serve_a_batch(server)
    summary = parse_canary_log(server.log_text())
    assert len(summary.startup) == 1, summary.startup  # one scheduler process (TP 1)
    assert summary.startup[0].message.startswith("KV canary enabled: mode=log")
    assert summary.startup[0].fields["mode"] == "log"
    assert summary.violations == ()


@pytest.mark.gpu
def test_bad_mode_stops_the_launch_before_loading_a_model(expect_launch_failure) -> None:
    outcome = expect_launch_failure(env={"SGLANG_KV_CANARY_MODE": "loud"}, timeout_s=60)
    for fragment in ("SGLANG_KV_CANARY_MODE", "'loud'", "none, log, raise"):
        assert fragment in outcome.output, outcome.output[-3000:]
    assert "Load weight" not in outcome.output
    assert "Traceback" not in outcome.output, outcome.output[-3000:]


@pytest.mark.gpu
def test_canary_off_leaves_no_trace_in_the_log(canary_server) -> None:
    server = canary_server()
    _serve_a_batch(server)
    log = server.log_text()
    summary = parse_canary_log(log)
    assert "KV canary" not in log
    assert (summary.startup, summary.stats, summary.violations, summary.notices) == ((),) * 4


@pytest.mark.gpu
def test_tiny_eagle_draft_serves_speculatively(canary_server, tiny_eagle_draft_dir) -> None:
    server = canary_server(args=[
        "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", str(tiny_eagle_draft_dir),
        "--speculative-num-steps", "2",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3",
    ])
    outputs = _serve_a_batch(server)
    assert server.request_json("GET", "/server_info")["speculative_algorithm"] == "EAGLE"
    assert any(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in outputs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
