"""The violation reporter under a persistent fault, end to end: the real :class:`CanaryRunner`
with the torch reference kernels on the self-check's simulated server (SGLang's own pools).

One cached prefix slot's K/V byte is flipped and stays flipped while requests of the same prompt
keep reusing that cached prefix (same request row, same slot, same position) for more than 5000
forwards; midway one forward carries a burst of extra rows that overflows the ring; then a
second, different slot is corrupted. In log mode each corruption is printed once (by the post
check: real data is verified after the forward), the burst's stored rows are printed and its
dropped rows reported in one overflow line,
the repeats are summarized (not printed), the health check keeps passing, and every violation
the kernels produced is accounted for exactly: rows reported + suppressed + dropped ==
``counters[COUNTER_VIOLATIONS]``.
"""

import logging
import random
import re
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    FIELD_FINGERPRINT,
    CheckKind,
    Reason,
)
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX
from sglang.srt.kv_canary.monitor.violation_reporter import (
    REPEAT_SUMMARY_EVERY,
    REPEATS_PREFIX,
    RING_OVERFLOW_PREFIX,
)
from sglang.srt.kv_canary.monitor.violations import VIOLATION_LINE_PREFIX, find_violation_rows
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.pools.mha import MHACanaryPool
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.scenarios import server_hooks, install_canary_runner
from sglang.srt.kv_canary.selfcheck.simulation import (
    SimulatedModelRunner,
    SimulatedRequest,
    SimulatedServer,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")

_PROMPT = list(range(100, 116))  # 16 tokens: later requests reuse the first 15 from the cache
_FIRST_FAULT_POSITION = 1
_SECOND_FAULT_POSITION = 2
_BURST_POSITIONS = range(3, 8)  # 5 slots: with the first fault's row, 6 rows overflow the ring
_RING_CAPACITY = 4
_PERSISTENT_FORWARDS = 5000
_BURST_STEP = 2500
_REPEAT_LINE = re.compile(
    re.escape(REPEATS_PREFIX) + r" (\d+) row\(s\) .* \((\d+) suppressed in total\)"
)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]


@pytest.fixture
def canary_log():
    logger = logging.getLogger("sglang.srt.kv_canary")
    saved = (logger.level, logger.propagate)
    handler = _Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # 5000 forwards: keep pytest's capture small
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(saved[0])
    logger.propagate = saved[1]


def test_a_persistent_fault_is_printed_once_and_a_second_fault_still_shows(canary_log) -> None:
    config = CanaryConfig(
        mode=CanaryMode.LOG, real_data=RealDataMode.ALL, ring_capacity=_RING_CAPACITY,
        stats_print_every_n_steps=1000, health_check_every_n_steps=64,
    )
    burst: list[torch.Tensor] = []

    def forward(batch):
        if server.forwards != _BURST_STEP:
            return around_forward(SimulatedModelRunner.forward, server.runner, batch)
        # one forward reads five more slots whose records disagree with their bytes
        records = runner.state.records
        saved = records[burst[0], FIELD_FINGERPRINT].clone()
        records[burst[0], FIELD_FINGERPRINT] ^= 1
        try:
            return around_forward(SimulatedModelRunner.forward, server.runner, batch)
        finally:
            records[burst[0], FIELD_FINGERPRINT] = saved

    server = SimulatedServer(page_size=1, num_pages=64, max_requests=1, max_context_len=32,
                             forward=forward, hooks=server_hooks(config))
    runner = install_canary_runner(model_runner=server.runner, config=config,
                                   kernels=load_kernels(KernelBackend.TORCH_REFERENCE))
    kv_bytes = FingerprintedBytes(pool=MHACanaryPool(server.kv_pool))

    def run_request() -> SimulatedRequest:
        """One request of the prompt: prefill (the cached 15 tokens shared), decode, finish."""
        request = SimulatedRequest(rid="r", prompt=list(_PROMPT), max_new_tokens=4)
        server.admit(request)
        server.extend([(request, len(request.prompt) - request.kv_len)])
        while not request.finished:
            server.decode([request])
        server.finish(request)
        return request

    first = SimulatedRequest(rid="r", prompt=list(_PROMPT), max_new_tokens=4)
    server.admit(first)
    server.extend([(first, len(_PROMPT))])  # step 0 writes and fingerprints the prompt
    row = first.req_pool_idx
    slot_of = server.req_to_token_pool.req_to_token[row].tolist()
    burst.append(torch.tensor([slot_of[p] for p in _BURST_POSITIONS]))
    kv_bytes.flip(slot=torch.tensor([slot_of[_FIRST_FAULT_POSITION]]), rng=random.Random(0))
    while not first.finished:
        server.decode([first])
    server.finish(first)
    while server.forwards <= _PERSISTENT_FORWARDS:
        request = run_request()
        assert request.req_pool_idx is None and request.pages == []  # finished
    second_fault_step = server.forwards
    kv_bytes.flip(slot=torch.tensor([slot_of[_SECOND_FAULT_POSITION]]), rng=random.Random(1))
    for _ in range(10):
        run_request()
    runner.on_idle()  # report the last forward's rows
    steps = server.forwards
    assert server.req_to_token_pool.req_to_token[row].tolist()[:15] == slot_of[:15]  # reused

    # what the kernels produced: both faulted slots verified by the post check of every forward
    # that read them, plus the burst's five extra slots at one forward
    produced = int(runner.state.counters[COUNTER_VIOLATIONS])
    second_fault_forwards = steps - second_fault_step
    assert second_fault_step - 1 >= _PERSISTENT_FORWARDS  # steps 1.. read the first fault alone
    assert produced == (steps - 1) + len(_BURST_POSITIONS) + second_fault_forwards

    # printed: each corruption once per check, where it first showed; nothing else
    post = CheckKind.POST_VERIFY
    printed = find_violation_rows("\n".join(canary_log.messages))
    assert all(r.reasons == int(Reason.VERIFY_REAL_KV) and r.req_pool_idx == row
               for r in printed)
    assert [(r.check, r.position, r.step) for r in printed] == [
        (post, _FIRST_FAULT_POSITION, 1),
        # the burst: the first fault's row (a repeat, not printed) and 3 burst rows fit the
        # ring of 4; the last 2 burst rows are dropped
        *[(post, p, _BURST_STEP) for p in _BURST_POSITIONS[:3]],
        (post, _SECOND_FAULT_POSITION, second_fault_step),
    ]
    assert {r.slot for r in printed if r.position == _FIRST_FAULT_POSITION} == {
        slot_of[_FIRST_FAULT_POSITION]
    }

    overflow = [m for m in canary_log.messages if m.startswith(RING_OVERFLOW_PREFIX)]
    assert overflow == [
        f"{RING_OVERFLOW_PREFIX} 2 violation row(s) were dropped (2 in total): more than "
        f"{_RING_CAPACITY} rows arrived between two reads by the host; set "
        "SGLANG_KV_CANARY_RING_CAPACITY to keep more"
    ]

    # the repeats are summarized: at once the first time, then at most every
    # REPEAT_SUMMARY_EVERY reports, each line counting the rows since the previous one
    summaries = [_REPEAT_LINE.fullmatch(m) for m in canary_log.messages
                 if m.startswith(REPEATS_PREFIX)]
    assert all(summaries)
    counts = [int(m[1]) for m in summaries]
    totals = [int(m[2]) for m in summaries]
    assert counts[0] == totals[0] == 1  # the first fault's row of step 2
    assert totals == [sum(counts[: i + 1]) for i in range(len(counts))]
    assert len(summaries) <= steps // REPEAT_SUMMARY_EVERY + 1

    # exact accounting: every violation index was printed, suppressed or dropped
    reporter = runner.monitor._reporter  # the monitor's reporter (no public accessor)
    assert reporter.rows_reported == len(printed) == 5
    assert reporter.rows_dropped == 2
    assert reporter.rows_reported + reporter.rows_suppressed + reporter.rows_dropped == produced
    assert totals[-1] <= reporter.rows_suppressed < totals[-1] + 2 * REPEAT_SUMMARY_EVERY
    assert int(runner.state.counters[COUNTER_CONSUMED]) == produced  # the whole ring is free

    # a bounded log: 5000 forwards of corruption are a few dozen warning lines, and the
    # canary stayed healthy throughout
    warnings = [r for r in canary_log.records if r.levelno >= logging.WARNING]
    assert len(warnings) == len(printed) + len(overflow) + len(summaries) < 100
    assert sum(VIOLATION_LINE_PREFIX in r.getMessage() for r in warnings) == 5
    assert sum(m.startswith(HEALTH_OK_PREFIX) for m in canary_log.messages) == steps // 64


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
