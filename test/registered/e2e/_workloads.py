"""Shared pieces of the end-to-end tests: requests, traffic, and what a log must show."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterable

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.burnin.server_log import LogFollower
from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX
from sglang.srt.kv_canary.monitor.stats import IDLE_LINE_RE, STATS_LINE_RE
from sglang.srt.kv_canary.monitor.violations import ViolationRow, find_violation_rows
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE

FIRST_TOKEN_ID, VOCAB = 5, 4096  # the tiny model's ordinary token ids
VERIFY_CHECKS = (CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY)
PERTURB = {"SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "30", "SGLANG_KV_CANARY_PERTURB_SEED": "7"}
# raise mode with every check (serve with --sampling-backend token_oracle)
EVERY_CHECK = {
    "SGLANG_KV_CANARY_MODE": "raise",
    "SGLANG_KV_CANARY_REAL_DATA": "partial",
    "SGLANG_KV_CANARY_SWEEP_INTERVAL": "8",
    "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
    "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1",
    "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
    "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "50",
    "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "50",
}


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, VOCAB) for _ in range(n)]


def request(rid: str, input_ids: list[int], max_new_tokens: int, **sampling: object) -> dict:
    return {
        "rid": rid,
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                            "ignore_eos": True, **sampling},
    }


def _text_payload(index: int, *, new_tokens: int) -> dict:
    return {
        "text": f"Request {index}: " + " ".join(["attention cache page"] * (3 + index % 20)),
        "rid": f"foundation-{index}",
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0,
                            "ignore_eos": True},
    }


def serve_a_batch(server, *, new_tokens: int = 12) -> list[dict]:
    """Concurrent single text requests, then one batched text request; asserts that every one
    completes with ``new_tokens`` tokens and returns their outputs."""
    outputs = server.generate_many([_text_payload(i, new_tokens=new_tokens) for i in range(24)],
                                   concurrency=8)
    batch = server.generate({
        "text": [f"batched prompt {i} about the radix cache" for i in range(8)],
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0,
                            "ignore_eos": True},
    })
    assert isinstance(batch, list) and len(batch) == 8
    for output in outputs + batch:
        assert output["meta_info"]["completion_tokens"] == new_tokens, output["meta_info"]
    return outputs + batch


def concurrent_traffic(server, *, rounds: int, seed: int = 5, per_round: int = 8,
                       new_tokens: int = 24) -> None:
    """Rounds of concurrently decoding requests (several live rows with a prefix per batch)."""
    rng = random.Random(seed)
    for round_index in range(rounds):
        payloads = [request(f"p{round_index}-{i}", tokens(rng, rng.randrange(20, 200)),
                            new_tokens) for i in range(per_round)]
        server.generate_many(payloads, concurrency=per_round)


def log_when(server, done: Callable[[str], bool], *, timeout_s: float = 20.0) -> str:
    """The server log as soon as ``done(log)`` holds, else after ``timeout_s`` (for the caller's
    assertion to show what is missing). A forward's violations are reported at the scheduler's
    next poll, which can come after the response to the request that ran that forward: a log
    read right after the last request can lack its last forward's rows."""
    deadline = time.monotonic() + timeout_s
    log = server.log_text()
    while not done(log) and time.monotonic() < deadline:
        time.sleep(0.2)
        log = server.log_text()
    return log


def polled_log(server, *, timeout_s: float = 20.0, quiet_s: float = 0.5) -> str:
    """The server log once the canary has reported every forward so far: after the last
    response, wait for an idle line (logged once the publication of the server's last forward
    was read, every row before it) and then ``quiet_s`` without a newer one, as the burn-in does
    (:meth:`~sglang.srt.kv_canary.burnin.server_log.LogFollower.wait_until_polled`). After
    ``timeout_s`` without an idle line, the log as it is (the caller's assertion then fails)."""
    follower = LogFollower(path=server.launch.log_path, start_offset=0)
    follower.wait_until_polled(timeout_s=timeout_s, quiet_s=quiet_s)
    return server.log_text()


def fault_has_row(fault: re.Match[str], rows: Iterable[ViolationRow], *, max_delay: int = 0,
                  reason: int = ~0) -> bool:
    """Whether a row at the fault's position, carrying a bit of ``reason`` (default: any),
    comes from its step (or the step before, when log mode did not print a corruption still
    present) to ``max_delay`` steps later."""
    step, position = int(fault["step"]), int(fault["position"])
    return any(step - 1 <= r.step <= step + max_delay and r.position == position
               and r.reasons & reason for r in rows)


def every_fault_reported(log: str, *, max_delay: int = 0) -> bool:
    """Whether every injected fault of ``log`` has a row (:func:`fault_has_row`, any reason):
    a predicate for :func:`log_when`."""
    faults, rows = faults_and_rows(log)
    return all(fault_has_row(fault, rows, max_delay=max_delay) for fault in faults)


def faults_and_rows(log: str) -> tuple[list[re.Match[str]], list[ViolationRow]]:
    faults = [m for m in map(PERTURB_LINE_RE.search, log.splitlines()) if m]
    return faults, find_violation_rows(log)


def union(rows: Iterable[ViolationRow]) -> int:
    bits = 0
    for row in rows:
        bits |= row.reasons
    return bits


def assert_every_fault_caught(faults, rows: list[ViolationRow], *, reason: Reason, allowed: int,
                              checks: tuple[CheckKind, ...] = VERIFY_CHECKS,
                              max_delay: int = 0) -> None:
    """Every fault has a row carrying ``reason`` (:func:`fault_has_row`); no row carries a
    reason outside ``allowed`` or comes from another check."""
    assert faults, "no fault was injected"
    stray = [r for r in rows if r.reasons & ~allowed or r.check not in checks]
    assert not stray, "\n".join(r.to_line() for r in stray[:10])
    for fault in faults:
        assert fault_has_row(fault, rows, max_delay=max_delay, reason=int(reason)), (
            fault.group(0))


def assert_clean_canary_log(log: str, *, min_health_checks: int = 2) -> None:
    """No violation row, a healthy canary that checked slots, and an idle line (read the log
    with :func:`polled_log`) saying every forward was polled with no violation."""
    idle = [m for m in map(IDLE_LINE_RE.search, log.splitlines()) if m]
    assert idle, "no 'KV canary idle' line: the last forwards were not reported yet"
    assert all(int(m["violations"]) == 0 for m in idle), [m.group(0) for m in idle][-3:]
    rows = find_violation_rows(log)
    assert rows == [], "\n".join(r.to_line() for r in rows[:20])
    assert "KV canary installed: records 32 B/slot" in log
    assert "canary path is not executing" not in log
    assert sum(HEALTH_OK_PREFIX in line for line in log.splitlines()) >= min_health_checks
    stats = [m for m in map(STATS_LINE_RE.search, log.splitlines()) if m]
    assert stats and int(stats[-1]["protected"]) > 0 and int(stats[-1]["written"]) > 0
    assert int(stats[-1]["violations"]) == 0
