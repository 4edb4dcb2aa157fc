"""The server-log parser: start-up, stats and violation lines behind SGLang's prefixes, tolerant
field extraction, and which other lines count as canary notices."""

import sys

import pytest

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, PerturbConfig
from sglang.srt.kv_canary.tools.canary_log import parse_canary_log
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

_SGLANG_NOISE = """\
[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/tmp/kv_canary_demo_x/model', tokenizer_path='/tmp/kv_canary_demo_x/model')
[2026-01-01 10:00:00] Available plugins for group sglang.srt.plugins:
[2026-01-01 10:00:00]   - kv_canary -> sglang.srt.kv_canary.plugin:activate
[2026-01-01 10:00:00] Loaded plugin kv_canary from group sglang.srt.plugins
[2026-01-01 10:00:00] Executed general plugin: kv_canary
[2026-01-01 10:00:00] Applied 1 hook(s) to sglang.srt.managers.scheduler.Scheduler.__init__ (from: kv_canary)
  File "/site/sglang/srt/kv_canary/startup.py", line 20, in log_startup_line
[kv_canary.tools.server] command: python -m sglang.launch_server --model-path /tmp/kv_canary_x
"""


def test_startup_line_from_describe_is_parsed_behind_the_sglang_prefix() -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, sweep_interval=8,
                          perturb=PerturbConfig(req_to_token_prob=0.25))
    summary = parse_canary_log(f"[2026-01-01 10:00:01 TP0] {config.describe()}\n")
    (line,) = summary.startup
    assert line.message == config.describe()
    assert line.fields["mode"] == "log" and line.fields["perturb"] == "[req_to_token:0.25]"
    assert line.counts["sweep_interval"] == 8 and line.counts["ring_capacity"] == 1024
    assert summary.stats == summary.violations == summary.notices == ()


@pytest.mark.parametrize(
    "text,expected",
    [
        ("KV canary stats: protected_tokens=20000, sweeps=4, violations=2",
         {"protected_tokens": 20000, "sweeps": 4, "violations": 2}),
        ("KV canary stats (step 300): protected 12345 tokens, 3 sweeps, 0 violations",
         {"tokens": 12345, "sweeps": 3, "violations": 0}),
        ("kv_canary stats: step=100 slots_checked=99", {"step": 100, "slots_checked": 99}),
    ],
)
def test_stats_lines_yield_their_numbers_in_either_style(text, expected) -> None:
    summary = parse_canary_log(f"[2026-01-01 10:00:05 DP0 TP1] {text}\n")
    (line,) = summary.stats
    assert line.message == text
    for key, value in expected.items():
        assert line.counts[key] == value


def test_violation_lines_keep_every_field() -> None:
    text = ("kv_canary violation: check=pre_verify fail_reason=verify_chain_hash+verify_position "
            "slot_idx=1234 position=17 stored_token=5 expected_token=-1 "
            "stored_chain_hash=0x1f expected_aux=0x2e,")
    log = f"[2026-01-01 10:00:06 TP0] WARNING {text}\nKV canary violation: a=1\n"
    summary = parse_canary_log(log)
    assert len(summary.violations) == 2
    first = summary.violations[0]
    assert first.fields["fail_reason"] == "verify_chain_hash+verify_position"
    assert first.fields["expected_aux"] == "0x2e"  # trailing punctuation dropped
    assert first.counts["expected_token"] == -1 and first.counts["slot_idx"] == 1234


def test_only_word_mentions_outside_loader_bookkeeping_are_notices() -> None:
    errors = ("[2026-01-01 10:00:06 TP0] Failed to execute general plugin: kv_canary\n"
              "[kv_canary] start-up refused: SGLANG_KV_CANARY_MODE='loud' is invalid\n"
              "RuntimeError: KV canary: health check failed, the verify kernel stopped running\n")
    summary = parse_canary_log(_SGLANG_NOISE + errors)
    assert summary.notices == tuple(errors.splitlines())
    assert parse_canary_log(_SGLANG_NOISE).notices == ()


def test_the_lines_the_runtime_writes_are_recognized() -> None:
    """Start-up, stats, health and violation lines as the canary's own modules format them."""
    from sglang.jit_kernel.kv_canary import consts
    from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX, HealthChecker
    from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
    from sglang.srt.kv_canary.monitor.stats import stats_line
    from sglang.srt.kv_canary.monitor.violations import ViolationRow

    row = [0] * consts.RING_ROW_FIELDS
    row[consts.ROW_CHECK] = consts.CheckKind.POST_VERIFY
    row[consts.ROW_REASONS] = consts.Reason.VERIFY_CHAIN | consts.Reason.VERIFY_POSITION
    row[consts.ROW_SLOT], row[consts.ROW_POSITION], row[consts.ROW_STEP] = 77, 5, 41
    counters = [0] * consts.NUM_COUNTERS
    counters[consts.COUNTER_VIOLATIONS] = 1
    counters[consts.COUNTER_ENTRIES + consts.CheckKind.PRE_VERIFY] = 300
    counters[consts.COUNTER_ENTRIES + consts.CheckKind.POST_VERIFY] = 200
    for kind in (consts.CheckKind.PRE_VERIFY, consts.CheckKind.POST_VERIFY,
                 consts.CheckKind.WRITE):
        counters[consts.COUNTER_KERNEL_RUNS + kind] = 40
    counters[consts.COUNTER_KERNEL_RUNS + consts.CheckKind.SWEEP] = 3
    counters[consts.COUNTER_ENTRIES + consts.CheckKind.SWEEP] = 90
    snapshot = CounterSnapshot(steps=40, launches=40, sweep_launches=3, counters=tuple(counters))
    startup = CanaryConfig(mode=CanaryMode.LOG).describe()
    health = HealthChecker(every_n_steps=40).check(steps=40, latest=snapshot)
    log = "".join(f"[2026-01-01 10:00:0{i} TP0] {line}\n" for i, line in enumerate(
        (startup, stats_line(snapshot), ViolationRow.from_ring_row(row).to_line(), health)))
    summary = parse_canary_log(log)
    assert [line.message for line in summary.startup] == [startup]
    assert summary.latest_stats is not None
    assert summary.latest_stats.counts["tokens"] == 500
    assert summary.latest_stats.counts["violations"] == 1
    assert summary.latest_stats.counts["sweeps"] == 3
    (violation,) = summary.violations
    assert violation.fields["check"] == "post_verify" and violation.counts["slot"] == 77
    assert violation.fields["reasons"] == "verify_chain_hash+verify_position"
    # the health line is recognized as a passed check now (it used to be kept as a notice)
    (passed,) = summary.health_ok
    assert passed.message == health and passed.message.startswith(HEALTH_OK_PREFIX)
    assert summary.notices == ()


def test_latest_stats_and_empty_log() -> None:
    summary = parse_canary_log("KV canary stats: n=1\nKV canary stats: n=2\n")
    assert summary.latest_stats is not None and summary.latest_stats.counts["n"] == 2
    empty = parse_canary_log("")
    assert empty.latest_stats is None and empty.startup == ()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
