"""The burn-in's judgement of answers, its reading of the server log, its summary text and its
exit code."""

import json
import pathlib
import sys

import pytest

from sglang.srt.kv_canary.burnin.client import Answer
from sglang.srt.kv_canary.burnin.driver import RunStats, judge_generation
from sglang.srt.kv_canary.burnin.exit_codes import ExitCode
from sglang.srt.kv_canary.burnin.server_log import LogFindings, LogFollower, read_findings
from sglang.srt.kv_canary.burnin.summary import BurninReport, exit_code, problems, render
from sglang.srt.kv_canary.burnin.workload import Request, WorkloadShape
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

SHAPE = WorkloadShape(page_size=16, token_low=5, token_high=4096, max_prompt_tokens=1000,
                      max_new_tokens=64, chunk_tokens=256, burst_requests=12)
STARTUP = "[2026 TP0] KV canary enabled: mode=raise real_data=partial sweep_interval=4"
STATS = ("[2026 TP0] KV canary stats: protected 123456 tokens (slots verified), 999 slots "
         "written, 3 sweeps (77 slots swept), 0 violations, 400 steps")
HEALTH = "[2026 TP0] kv_canary health ok: steps 0..100: 100 launches, kernel runs pre_verify 100"
ROW = ("kv_canary violation: check=pre_verify reasons=verify_owner+verify_token req_pool_idx=2 "
       "slot=9 position=4 stored_token=1 expected_token=2 stored_chain=0x0000000000000001 "
       "expected_chain=0x0000000000000002 step=7")
WRITE_ROW = ("kv_canary violation: check=write reasons=write_token req_pool_idx=2 slot=10 "
             "position=5 stored_token=1 expected_token=2 input_position=5 expected_position=5 "
             "step=8 pool=draft")
RETRACT = ("[2026 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
           "#new_tokens_gained: 900, #new_token_ratio: 0.7 -> 1.0")


def _answer(body: object, status: int = 200) -> Answer:
    return Answer(status=status, body=json.dumps(body).encode())


def _output(*, finish: str = "length", tokens: int = 4, prompt: int = 10) -> dict:
    return {"text": "", "meta_info": {"prompt_tokens": prompt, "completion_tokens": tokens,
                                      "cached_tokens": 3, "finish_reason": {"type": finish}}}


# ----------------------------------------------------------------------------- answers
def test_a_complete_answer_is_completed_with_its_tokens() -> None:
    request = Request(rid="r", input_ids=(5,), max_new_tokens=4, n=2)
    judged = judge_generation(request, _answer([_output(), _output()]))
    assert (judged.outcome, judged.prompt_tokens, judged.generated_tokens,
            judged.cached_tokens) == ("completed", 20, 8, 6)


@pytest.mark.parametrize(
    "answer, fragment",
    [
        (_answer({"error": {"message": "boom"}}, status=400), "r: /generate answered 400: "),
        (Answer(status=200, body=b"<html>"), "answered no JSON"),
        (_answer([_output()]), "1 output(s) for n=2"),
        (_answer([_output(), _output(tokens=3)]), "finished with {'type': 'length'} after 3 of "
                                                  "4 tokens"),
        (_answer([_output(), _output(finish="abort")]), "finished with {'type': 'abort'}"),
    ],
)
def test_a_wrong_answer_fails_saying_what_was_wrong(answer, fragment) -> None:
    request = Request(rid="r", input_ids=(5,), max_new_tokens=4, n=2)
    judged = judge_generation(request, answer)
    assert judged.outcome == "failed" and fragment in judged.message


def test_an_aborted_request_may_finish_with_abort_or_complete() -> None:
    request = Request(rid="r", input_ids=(5,), max_new_tokens=4)
    assert judge_generation(request, _answer(_output(finish="abort", tokens=1)),
                            abort_sent=True).outcome == "aborted"
    assert judge_generation(request, _answer(_output()), abort_sent=True).outcome == "completed"
    assert judge_generation(request, _answer(_output(finish="stop", tokens=2)),
                            abort_sent=True).outcome == "failed"


# ----------------------------------------------------------------------------- log
def test_the_log_window_starts_where_the_log_ended(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    before = f"{STARTUP}\n[x] {ROW}\n"
    log.write_text(before + f"{STATS}\n{HEALTH}\n[x] {ROW.replace('step=7', 'step=70')}\n"
                   f"[x] {ROW.replace('step=7', 'step=70')}\n[x] {WRITE_ROW}\n{RETRACT}\n"
                   f"{RETRACT}\n[x] kv_canary violation repeats: 4 row(s) of corruption\n"
                   "[x] KV canary health check failed: canary path is not executing\n")
    found = read_findings(path=log, start_offset=len(before))
    assert found.startup == (STARTUP[STARTUP.index("KV"):],)
    assert len(found.violations) == 2  # the row logged twice counts once; the earlier one not
    assert dict(found.by_reason) == {"verify_owner": 1, "verify_token": 1,
                                     "write_token (draft)": 1}
    assert found.latest_stats.startswith("KV canary stats: protected 123456 tokens")
    assert (found.protected, found.stats_violations, found.health_ok) == (123456, 0, 1)
    assert found.health_failures == (
        "[x] KV canary health check failed: canary path is not executing",)
    assert any("violation repeats: 4 row(s)" in notice for notice in found.notices)
    assert (found.retractions, found.retracted_requests) == (2, 6)
    assert not found.restarted and found.window_bytes == len(log.read_bytes()) - len(before)
    rewritten = read_findings(path=log, start_offset=10**9)
    assert rewritten.restarted and len(rewritten.violations) == 3


def test_the_follower_reads_whole_lines_as_they_come(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("old line\n")
    follower = LogFollower(path=log, start_offset=log.stat().st_size)
    with log.open("a") as out:
        out.write(f"[x] {ROW[:40]}")
    assert follower.poll() == "" and follower.violations_so_far() == 0
    with log.open("a") as out:
        out.write(f"{ROW[40:]}\n[x] {ROW}\n")
    assert follower.violations_so_far() == 1  # one row, logged twice
    assert LogFollower(path=tmp_path / "missing.log", start_offset=0).poll() == ""


# ----------------------------------------------------------------------------- report
def _run(**overrides: object) -> RunStats:
    values = dict(elapsed_s=120.4, stop_reason="the duration (120 s) was reached",
                  actions={"page_prefix": 60, "flush": 10}, requests=500, sequences=620,
                  completed=480, aborted=4, abort_missed=6, disconnected=10,
                  disconnect_missed=3, prompt_tokens=90000, generated_tokens=30000,
                  cached_tokens=40000, flushes=10, flushed=2, flush_refused=8, health_ok=8)
    values.update(overrides)
    return RunStats(**values)


def _findings(**overrides: object) -> LogFindings:
    values = dict(path=pathlib.Path("/var/log/sglang.log"), window_bytes=5000, restarted=False,
                  startup=("KV canary enabled: mode=log",), latest_stats=STATS[11:],
                  protected=123456, stats_violations=0, health_ok=12, health_failures=(),
                  violations=(), by_reason={}, notices=(), retractions=3,
                  retracted_requests=9)
    values.update(overrides)
    return LogFindings(**values)


def _report(**overrides: object) -> BurninReport:
    values = dict(target="http://h:1 (running)", seed=5, shape=SHAPE,
                  page_size_source="the server's", run=_run(), log=_findings())
    values.update(overrides)
    return BurninReport(**values)


def test_a_clean_report() -> None:
    report = _report()
    text = render(report)
    assert exit_code(report) is ExitCode.CLEAN and problems(report) == []
    for line in (
        "== KV canary burn-in ==",
        "server       : http://h:1 (running)",
        "workload     : seed 5, page size 16 (the server's), prompts <= 1000 tokens (chunks "
        "of 256), generations <= 64, bursts of 12",
        "ran          : 120.4 s; stopped: the duration (120 s) was reached",
        "actions      : page_prefix 60, flush 10",
        "requests     : 500 sent (620 sequences): 480 completed, 0 failed",
        "aborts       : 10: 4 cut short, 6 finished first",
        "disconnects  : 10: 7 left early, 3 finished first",
        "tokens       : 120000 (prompt 90000, of them cached 40000; generated 30000)",
        "flushes      : 10: 2 flushed, 8 refused while requests ran",
        "retractions  : 3 (9 requests retracted)",
        "health       : /health_generate 8 ok, 0 failed; canary health checks 12 passed, 0 failed",
        "canary       : KV canary enabled: mode=log (1 scheduler(s))",
        f"canary stats : {STATS[11:]}",
        "violations   : 0",
    ):
        assert line in text.splitlines(), line
    assert text.endswith("RESULT: clean: no violation, 480 requests completed, 123456 slot "
                         "verifications (exit 0)")


def test_violations_win_over_failures() -> None:
    log = _findings(violations=(ROW,), by_reason={"verify_owner": 1, "verify_token": 1})
    report = _report(log=log, run=_run(failure_count=3, failures=("r1: boom",)),
                     server_failure="the server exited with code 1")
    text = render(report)
    assert exit_code(report) is ExitCode.VIOLATIONS
    assert "violations   : 1" in text and "  by reason  : verify_owner 1, verify_token 1" in text
    assert f"violation rows:\n  {ROW}" in text and "failures:\n  r1: boom" in text
    assert text.endswith("RESULT: 1 violation(s) (exit 1)")


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"run": _run(failure_count=2, failures=("r7: /generate answered 500: x",))},
         "2 failure(s); the first: r7: /generate answered 500: x"),
        ({"run": _run(in_flight_at_end=2)}, "2 action(s) still in flight"),
        ({"run": _run(completed=0)}, "no request completed"),
        ({"server_failure": "the server exited with code -9"}, "the server exited with code -9"),
        ({"log": _findings(startup=())}, "has no 'KV canary enabled' line: the canary is not on"),
        ({"log": _findings(health_failures=("KV canary health check failed: x",))},
         "the canary failed its health check: KV canary health check failed: x"),
    ],
)
def test_each_problem_exits_2(overrides, fragment) -> None:
    report = _report(**overrides)
    assert exit_code(report) is ExitCode.FAILURE
    last = render(report).splitlines()[-1]
    assert last.startswith("RESULT: FAILED: ") and fragment in last and last.endswith("(exit 2)")


def test_without_a_log_the_report_says_violations_are_unknown() -> None:
    report = _report(log=None)
    text = render(report)
    assert exit_code(report) is ExitCode.CLEAN
    assert ("violations   : UNKNOWN -- no --server-log given; the canary's 'kv_canary "
            "violation' lines are in the server's log") in text
    assert "canary       : unknown (no --server-log given)" in text
    assert text.endswith("RESULT: served without failure; violations not checked (no "
                         "--server-log given) (exit 0)")


def test_long_lists_are_cut_with_a_count() -> None:
    failures = tuple(f"failure {i}" for i in range(20))
    text = render(_report(run=_run(failure_count=25, failures=failures)))
    assert "  failure 9\n  ... and 10 more" in text and "failure 10\n" not in text



def test_the_follower_waits_for_the_idle_line_then_for_quiet(tmp_path) -> None:
    """After the last answer the burn-in waits for the canary's idle line (every forward
    reported) and a quiet spell; without one it gives up at the timeout."""
    log = tmp_path / "server.log"
    log.write_text("startup\n")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if 0.2 <= now[0] < 0.25:  # the rows of the last forward, then the idle line
            with log.open("a") as out:
                out.write("kv_canary violation: check=post_verify reasons=verify_not_landed "
                          "req_pool_idx=1 slot=5 position=3 stored_token=1 expected_token=-1 "
                          "stored_chain=0x0000000000000001 expected_chain=0x0000000000000001 "
                          "step=9\n")
                out.write("KV canary idle: every forward through step 9 polled, 1 violations\n")

    follower = LogFollower(path=log, start_offset=0)
    assert follower.wait_until_polled(timeout_s=5.0, quiet_s=0.5, clock=lambda: now[0],
                                      sleep=sleep)
    assert 0.7 <= now[0] < 1.0 and follower.violations_so_far() == 1
    silent = LogFollower(path=log, start_offset=log.stat().st_size)
    now[0] = 0.0
    assert not silent.wait_until_polled(timeout_s=2.0, clock=lambda: now[0],
                                        sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] >= 2.0

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
