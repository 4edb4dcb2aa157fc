"""End-to-end on a GPU: the radix sweep, the padded-row bug re-injected, the seq_lens invariant.

1. Radix sweep (``SWEEP_INTERVAL``): a clean run with eviction under a small KV pool stays
   clean while passes cover the cache; a byte flipped in a cached slot no request uses
   (``PERTURB_REAL_KV_UNUSED_CACHE_PROB``) is reported by ``check=sweep``.
2. A byte flipped right after the forward in a slot it wrote (``..._REAL_KV_POST_FORWARD_PROB``)
   is reported by a later verify of that slot.
3. ``REINJECT_PADDED_ROW_BUG=1`` leaves SGLang 0.5.12's stale padded CUDA-graph rows in place:
   the canary reports each one (``padded_row``: a row past the replay's live rows still names a
   request) and lets it change nothing (no other row in the log).
4. A device ``seq_lens`` drifting from the scheduler's host mirror (``PERTURB_SEQ_LENS_PROB``)
   is reported by ``verify_seq_lens``.
"""

import random
import re
import sys

import pytest
from _workloads import (
    PERTURB,
    assert_clean_canary_log,
    concurrent_traffic,
    faults_and_rows,
    polled_log,
    request,
    tokens,
    union,
)

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.monitor.stats import STATS_LINE_RE
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=420, suite="kv-canary-gpu")

_SMALL_POOL = ("--page-size", "16", "--chunked-prefill-size", "256", "--max-total-tokens", "4096")
_LOG = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "partial",
        "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "20",
        "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "20"}


def _distinct_prompts(server, *, count: int, seed: int) -> None:
    """Distinct prompts, sequentially: each leaves its prefix in the radix cache, unlocked."""
    rng = random.Random(seed)
    for index in range(count):
        server.generate(request(f"d{seed}-{index}", tokens(rng, rng.randrange(40, 300)), 8))


@pytest.mark.gpu
def test_sweep_keeps_a_long_run_with_eviction_clean(canary_server) -> None:
    env = {**_LOG, "SGLANG_KV_CANARY_MODE": "raise", "SGLANG_KV_CANARY_SWEEP_INTERVAL": "4"}
    server = canary_server(env=env, args=_SMALL_POOL)
    _distinct_prompts(server, count=40, seed=1)  # more than the pool holds: eviction
    concurrent_traffic(server, rounds=4, seed=2)
    log = polled_log(server)
    assert server.returncode is None
    assert_clean_canary_log(log)
    stats = [m for m in map(STATS_LINE_RE.search, log.splitlines()) if m]
    assert int(stats[-1]["sweeps"]) > 0 and int(stats[-1]["swept"]) > 0, stats[-1].group(0)


@pytest.mark.gpu
def test_sweep_reports_a_flipped_byte_in_an_unused_cached_slot(canary_server) -> None:
    env = {**_LOG, **PERTURB, "SGLANG_KV_CANARY_SWEEP_INTERVAL": "4",
           "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB": "0.5"}
    server = canary_server(env=env, args=("--page-size", "16", "--max-total-tokens", "65536"))
    _distinct_prompts(server, count=60, seed=4)
    log = server.log_text()
    faults, rows = faults_and_rows(log)
    assert faults, log[-3000:]
    sweep_rows = [r for r in rows if r.check is CheckKind.SWEEP]
    for fault in faults:  # caught by the pass the fault was injected before
        assert any(r.step == int(fault["step"]) and r.position == int(fault["position"])
                   and r.reasons & int(Reason.VERIFY_REAL_KV) for r in sweep_rows), fault.group(0)
    assert union(rows) & ~int(Reason.VERIFY_REAL_KV) == 0


@pytest.mark.gpu
def test_a_byte_flipped_after_the_forward_is_reported_by_a_later_verify(canary_server) -> None:
    env = {**_LOG, **PERTURB, "SGLANG_KV_CANARY_PERTURB_REAL_KV_POST_FORWARD_PROB": "0.1"}
    server = canary_server(env=env, args=("--page-size", "16", "--max-total-tokens", "65536"))
    concurrent_traffic(server, rounds=6, new_tokens=48)
    log = server.log_text()
    faults, rows = faults_and_rows(log)
    assert faults and rows, log[-3000:]
    assert union(rows) & ~int(Reason.VERIFY_REAL_KV) == 0
    # Every flip is read again by its request's next forward (it keeps decoding) unless that
    # was its last token; the verify reports it at the flipped position, later.
    caught = [f for f in faults if any(
        r.position == int(f["position"]) and r.step > int(f["step"]) for r in rows)]
    assert len(caught) >= len(faults) // 2, (len(caught), len(faults))


@pytest.mark.gpu
def test_reinjected_padded_row_bug_is_reported(canary_server) -> None:
    env = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REINJECT_PADDED_ROW_BUG": "1"}
    server = canary_server(env=env, args=("--cuda-graph-max-bs", "8",))
    rng = random.Random(6)
    # 8 rows fill the bs-8 graph; then 5 rows replay it padded: rows 5..7 keep the old indices.
    server.generate_many([request(f"full-{i}", tokens(rng, 40), 40) for i in range(8)],
                         concurrency=8)
    server.generate_many([request(f"part-{i}", tokens(rng, 40), 40) for i in range(5)],
                         concurrency=5)
    log = server.log_text()
    assert "padded_row_fix=OFF" in log
    _, rows = faults_and_rows(log)
    padded = [r for r in rows if r.reasons & int(Reason.PADDED_ROW)]
    assert padded, log[-3000:]
    # each one a stale padded row (past the live rows) that changed nothing: no other reason
    # in the whole log, no verify_owner of the live requests it pointed at
    assert all(r.check is CheckKind.PRE_VERIFY and r.reasons == int(Reason.PADDED_ROW)
               and r.slot == 0 and r.req_pool_idx != 0 and r.position >= r.expected_chain
               for r in padded)
    assert len(padded) == len(rows), [r for r in rows if r not in padded][:5]


@pytest.mark.gpu
def test_a_seq_lens_drift_is_reported_by_the_invariant(canary_server) -> None:
    env = {"SGLANG_KV_CANARY_MODE": "log", **PERTURB,
           "SGLANG_KV_CANARY_PERTURB_SEQ_LENS_PROB": "0.2"}
    server = canary_server(env=env, args=("--page-size", "16",))
    concurrent_traffic(server, rounds=6)
    faults, rows = faults_and_rows(server.log_text())
    assert faults
    drift = [r for r in rows if r.reasons & int(Reason.VERIFY_SEQ_LENS)]
    for fault in faults:
        assert any(int(fault["step"]) - 1 <= r.step <= int(fault["step"]) for r in drift), \
            fault.group(0)
    assert all(r.check is CheckKind.PRE_VERIFY and r.slot == 0 for r in drift)
    assert re.search(r"verify_seq_lens", server.log_text())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
