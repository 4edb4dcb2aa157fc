"""End-to-end: a real ``python -m sglang.launch_server`` with the plugin installed, on the tiny
dummy-weight model (fixtures from ``e2e_fixtures.py``).

Proves: with ``SGLANG_KV_CANARY_MODE=log`` the server serves and its scheduler logs the start-up
line; a bad mode stops the launch fast, before any model loading, with the variable, the value
and the allowed values; with the canary off the log never mentions it; and the memory budget:
the canary's fixed buffers are reserved from the profiled KV budget and its records add 32 B to
every token's cell, so the KV pool of a canary server holds ``(available - reserved) // (cell +
32)`` tokens where a server without the canary holds ``available // cell``; every buffer the
canary allocated fits its reservation.

The canary-off and the log-mode server (module fixtures ``canary_off_log`` and
``log_mode_server``) take the whole profiled KV budget (no token cap), and the memory check
compares their two pools: SGLang sizes a pool from the GPU memory free at its start, so these
tests must run alone on the GPU (the serial shard of ``scripts/gpu_tests.sh``), the canary-off
server stopped before the log-mode one starts.
"""

import re
import sys

import pytest
from _workloads import serve_a_batch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.tools.canary_log import parse_canary_log
from sglang.srt.kv_canary.tools.server import RunningServer
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="kv-canary-gpu")

# The tiny model (tools/tiny_model.py): 4 layers, 2 KV heads of 64 bf16 values, K and V.
_CELL_BYTES = 4 * 2 * 2 * 64 * 2
_NO_TOKEN_CAP = ("--max-total-tokens", "1000000000")  # above the profile: SGLang uses the profile
_BUDGET_RE = re.compile(r"KV canary memory budget: (\d+) B profiled for the KV pool, (\d+) B "
                        r"reserved")
_DEVICE_RE = re.compile(r"KV canary device memory: (\d+) B allocated = records (\d+) B .*?"
                        r"fixed buffers (\d+) B \(reserved (\d+) B")
_TOKENS_RE = re.compile(r"max_total_num_tokens=(\d+)")


def _max_total_tokens(log: str) -> int:
    return int(_TOKENS_RE.findall(log)[-1])


@pytest.fixture(scope="module")
def canary_off_log(shared_servers) -> str:
    """The log of a canary-off server over the whole profiled KV budget after it served a batch
    (:func:`serve_a_batch`); the server is stopped before this returns, so the next server
    profiles the same free memory."""
    server = shared_servers.get(args=_NO_TOKEN_CAP)
    serve_a_batch(server)
    log = server.log_text()
    shared_servers.release(server)
    return log


@pytest.fixture(scope="module")
def log_mode_server(canary_off_log, shared_servers) -> RunningServer:
    """A log-mode canary server over the whole profiled KV budget, started only once the
    canary-off server of ``canary_off_log`` has stopped (hence that argument)."""
    return shared_servers.get(env={"SGLANG_KV_CANARY_MODE": "log"}, args=_NO_TOKEN_CAP)


@pytest.mark.gpu
def test_log_mode_serves_and_logs_the_startup_line(log_mode_server) -> None:
    serve_a_batch(log_mode_server)
    summary = parse_canary_log(log_mode_server.log_text())
    assert len(summary.startup) == 1, summary.startup  # one scheduler process (TP 1)
    assert summary.startup[0].message.startswith("KV canary enabled: mode=log")
    assert summary.startup[0].fields["mode"] == "log"
    assert summary.violations == ()


@pytest.mark.gpu
def test_launch_flags_alone_turn_the_canary_on(canary_server) -> None:
    """``--kv-canary log --kv-canary-real-data partial`` and no variable: the scheduler process
    reads the launching command line's flags, and the canary checks the served batch."""
    server = canary_server(env={}, args=("--kv-canary", "log", "--kv-canary-real-data",
                                         "partial"))
    serve_a_batch(server)
    summary = parse_canary_log(server.log_text())
    assert len(summary.startup) == 1, summary.startup
    assert summary.startup[0].fields["mode"] == "log"
    assert summary.startup[0].fields["real_data"] == "partial"
    assert summary.violations == ()


@pytest.mark.gpu
def test_bad_mode_stops_the_launch_before_loading_a_model(expect_launch_failure) -> None:
    outcome = expect_launch_failure(env={"SGLANG_KV_CANARY_MODE": "loud"}, timeout_s=60)
    for fragment in ("SGLANG_KV_CANARY_MODE", "'loud'", "none, log, abort, raise"):
        assert fragment in outcome.output, outcome.output[-3000:]
    assert "Load weight" not in outcome.output
    assert "Traceback" not in outcome.output, outcome.output[-3000:]


@pytest.mark.gpu
def test_canary_off_leaves_no_trace_in_the_log(canary_off_log) -> None:
    summary = parse_canary_log(canary_off_log)
    assert "KV canary" not in canary_off_log
    assert (summary.startup, summary.stats, summary.violations, summary.notices) == ((),) * 4


@pytest.mark.gpu
def test_kv_pool_shrinks_by_the_documented_amount(canary_off_log, log_mode_server) -> None:
    tokens_off = _max_total_tokens(canary_off_log)
    log = log_mode_server.log_text()
    available, reserved = map(int, _BUDGET_RE.search(log).groups())
    tokens_on = _max_total_tokens(log)
    # the canary server's own arithmetic, exactly (pages of 1 token)
    assert tokens_on == (available - reserved) // (_CELL_BYTES + RECORD_BYTES), log[-2000:]
    # against the server without the canary (its profile differs by at most a few MB)
    assert abs(tokens_off - available // _CELL_BYTES) <= 0.002 * tokens_off
    allocated, records, fixed, reserved_logged = map(int, _DEVICE_RE.search(log).groups())
    assert reserved_logged == reserved and fixed <= reserved
    assert records == (tokens_on + 1) * RECORD_BYTES  # one record per slot, padding slot 0 too
    assert allocated == records + fixed


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
