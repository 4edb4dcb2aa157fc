"""The burn-in end to end on the CPU, against a stand-in of SGLang's HTTP server
(``_fake_server.FakeSglang``, in this process, or started as a server by the burn-in): every
ingredient reaches the server, and the exit code is 0 clean, 1 with a violation row in the log,
2 for a failed request, a failed health probe, a canary that is not on or a server that cannot
be reached."""

import io
import pathlib
import subprocess
import sys
import time

import pytest
from _fake_server import FakeSglang

from sglang.srt.kv_canary.burnin.cli import BurninConfig, StartSpec
from sglang.srt.kv_canary.burnin.client import Client
from sglang.srt.kv_canary.burnin.driver import Driver, Limits
from sglang.srt.kv_canary.burnin.exit_codes import ExitCode
from sglang.srt.kv_canary.burnin.session import run_burnin
from sglang.srt.kv_canary.burnin.workload import Request, WorkloadShape, actions
from sglang.srt.kv_canary.tools.server import free_port
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="kv-canary-cpu")

_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parents[2]
# Small and quick: the fake answers in milliseconds.
_SMALL = dict(concurrency=6, max_new_tokens=32, burst_requests=6, request_timeout_s=20.0,
              progress_interval_s=0.5, health_interval_s=0.5, settle_s=0.1)


def _config(url: str, **overrides: object) -> BurninConfig:
    return BurninConfig(url=url, **{"duration_s": 3.0, **_SMALL, **overrides})


def _run(config: BurninConfig) -> tuple[ExitCode, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_burnin(config, out=out, err=err, rid_prefix="test")
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def log_path(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "server.log"
    path.write_text("[fake] earlier lines of a long-running server\n")
    return path


def test_a_clean_run_sends_every_ingredient_and_exits_0(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path, token_s=0.004) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path))
    assert code is ExitCode.CLEAN, out + err
    assert "RESULT: clean: no violation" in out and "(exit 0)" in out
    assert "violations   : 0" in out
    assert "page size 4 (the server's)" in out
    for ingredient in ("page_prefix", "repeat", "long_chunked", "parallel_n",
                       "retraction_burst", "abort", "disconnect", "flush", "mixed"):
        assert f"{ingredient} " in out.split("actions      : ")[1].splitlines()[0], ingredient
    seen = fake.seen
    assert seen.parallel and seen.texts and seen.aborts and seen.flushes and seen.streams
    assert seen.health >= 2 and seen.server_info == 1
    assert all(rid.startswith("test-") for rid in seen.aborts)
    assert "KV canary enabled: mode=log" in out and "canary health checks" in out
    assert "retractions  : " in out and "KV canary stats: protected" in out
    progress = [line for line in err.splitlines() if "progress " in line]
    assert progress and "violations 0" in progress[-1]
    assert "done " in err


def test_aborts_land_while_requests_run(log_path: pathlib.Path) -> None:
    # 32 tokens at 40 ms: a generation takes 1.3 s, most aborts (0.02-1.5 s) cut it short.
    with FakeSglang(log_path=log_path, token_s=0.04) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=4.0,
                                      concurrency=12))
    assert code is ExitCode.CLEAN, out + err
    assert fake.seen.aborted >= 1
    aborts = next(line for line in out.splitlines() if line.startswith("aborts"))
    assert " 0 cut short" not in aborts, aborts


def test_a_violation_row_in_the_log_exits_1_with_its_reasons(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path, violation_after=5) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path))
    assert code is ExitCode.VIOLATIONS, out + err
    assert "violations   : 1" in out
    assert "by reason  : verify_chain_hash 1, verify_position 1" in out
    assert "kv_canary violation: check=post_verify" in out
    assert "RESULT: 1 violation(s) (exit 1)" in out


def test_a_violation_before_the_burn_in_is_not_counted(log_path: pathlib.Path) -> None:
    with log_path.open("a") as log:
        log.write("[old] KV canary enabled: mode=log\n[old] kv_canary violation: check=pre_verify "
                  "reasons=verify_owner req_pool_idx=1 slot=2 position=3 stored_token=4 "
                  "expected_token=5 stored_chain=0x0000000000000001 "
                  "expected_chain=0x0000000000000002 step=9\n")
    with FakeSglang(log_path=log_path, canary_on=False) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=1.5))
    assert code is ExitCode.CLEAN, out + err  # the start-up line is older than the window too
    assert "violations   : 0" in out


def test_a_failed_request_exits_2_and_stops_the_run(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path, fail_generate_at=5) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=30.0))
    assert code is ExitCode.FAILURE, out + err
    assert "answered 500" in out and "fake internal error" in out
    assert "stopped: a failure: " in out
    assert "RESULT: FAILED: 1 failure(s)" in out and "(exit 2)" in out
    ran = next(line for line in out.splitlines() if line.startswith("ran"))
    assert float(ran.split()[2]) < 25.0  # the first failure ends the run


def test_a_failed_health_probe_exits_2(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path, health_status=503) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=30.0))
    assert code is ExitCode.FAILURE, out + err
    assert "health probe: /health_generate answered 503" in out


def test_a_log_without_the_canary_exits_2(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path, canary_on=False) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=1.5))
    assert code is ExitCode.FAILURE, out + err
    assert "has no 'KV canary enabled' line: the canary is not on" in out
    assert "canary       : NOT ON" in out


def test_without_a_log_violations_are_unknown_and_a_served_run_exits_0() -> None:
    with FakeSglang(violation_after=1, log_path=None) as fake:
        code, out, err = _run(_config(fake.url, duration_s=1.5))
    assert code is ExitCode.CLEAN, out + err
    assert "violations   : UNKNOWN -- no --server-log given" in out
    assert "RESULT: served without failure; violations not checked" in out
    assert "violations ?" in err


def test_a_server_without_server_info_gets_page_size_1_and_a_note(log_path) -> None:
    with FakeSglang(log_path=log_path, server_info=False) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=1.5,
                                      max_prompt_tokens=200))
    assert code is ExitCode.CLEAN, out + err
    assert "page size 1 (default: the server did not say)" in out
    assert "did not answer /server_info" in out
    assert "chunked prefill is not exercised" in out


def test_an_explicit_page_size_wins_with_a_note(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path, page_size=4) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=1.5,
                                      page_size=8))
    assert code is ExitCode.CLEAN, out + err
    assert "page size 8 (--page-size)" in out
    assert "--page-size 8 differs from the server's page size 4" in out


def test_the_token_budget_stops_the_run(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path) as fake:
        code, out, err = _run(_config(fake.url, server_log=log_path, duration_s=None,
                                      max_tokens=5000))
    assert code is ExitCode.CLEAN, out + err
    assert "stopped: the token budget (5000) was reached" in out


def test_an_unreachable_server_exits_2() -> None:
    code, out, err = _run(_config(f"http://127.0.0.1:{free_port()}", duration_s=1.0))
    assert code is ExitCode.FAILURE
    assert "the server cannot be reached" in err and "(exit 2)" in out


def test_the_driver_counts_what_it_sent() -> None:
    shape = WorkloadShape(page_size=2, token_low=5, token_high=100, max_prompt_tokens=100,
                          max_new_tokens=8, chunk_tokens=40, burst_requests=4)
    said: list[str] = []
    with FakeSglang(page_size=2, chunk=40) as fake:
        stats = Driver(client=Client(base_url=fake.url, timeout_s=10.0),
                       actions=actions(shape=shape, seed=1, rid_prefix="d"),
                       limits=Limits(duration_s=None, max_tokens=3000), concurrency=4,
                       progress_interval_s=0, health_interval_s=0, say=said.append).run()
    assert stats.failure_count == 0 and stats.in_flight_at_end == 0
    assert stats.tokens >= 3000 and stats.prompt_tokens > 0 and stats.generated_tokens > 0
    assert stats.requests >= stats.completed > 0 and stats.sequences > stats.requests
    assert stats.flushes == stats.flushed + stats.flush_refused >= 1
    assert stats.health_ok == stats.health_failed == 0  # probes off
    assert said and said[-1].startswith("done ")


def test_a_client_that_leaves_closes_its_connection() -> None:
    request = Request(rid="leave-1", input_ids=(5, 6, 7), max_new_tokens=40)
    with FakeSglang(token_s=0.05) as fake:
        client = Client(base_url=fake.url, timeout_s=10.0)
        streamed = client.generate_then_leave(request.payload(), after_s=0.05, streaming=True)
        assert (streamed.answer, streamed.finished) == (None, False) and streamed.events == 1
        plain = client.generate_then_leave(request.payload(), after_s=0.1, streaming=False)
        assert (plain.answer, plain.finished, plain.events) == (None, False, 0)
        deadline = time.monotonic() + 20
        while fake.seen.streams_left == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the server notices at its next write
        assert fake.seen.streams_left == 1
        quick = client.generate_then_leave({**request.payload(), "input_ids": [1] * 5000},
                                           after_s=5.0, streaming=True)
        assert quick.finished and quick.answer is not None and quick.answer.status == 400


def test_a_started_server_is_launched_watched_and_stopped(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "owned" / "server.log"
    start = StartSpec(model_path=tmp_path, server_args=("--page-size", "2"),
                      env={"PYTHONPATH": str(_HERE), "SGLANG_KV_CANARY_MODE": "log"},
                      server_module="_fake_server", ready_timeout_s=60.0, log_path=log)
    code, out, err = _run(BurninConfig(start=start, duration_s=2.0, **_SMALL))
    assert code is ExitCode.CLEAN, out + err
    assert "(started: python -m _fake_server --model-path" in out
    assert "page size 2 (the server's)" in out
    assert f"log          : {log}" in out
    assert "server ready at http://127.0.0.1:" in err
    text = log.read_text()
    assert "[fake] launched with" in text and "SGLANG_KV_CANARY_MODE" not in text


def test_a_server_that_fails_to_start_exits_2(tmp_path: pathlib.Path) -> None:
    start = StartSpec(model_path=tmp_path, env={"PYTHONPATH": str(_HERE)},
                      server_module="_no_such_server_module", ready_timeout_s=60.0,
                      log_path=tmp_path / "server.log")
    code, out, err = _run(BurninConfig(start=start, duration_s=2.0, **_SMALL))
    assert code is ExitCode.FAILURE
    assert "the server failed to start" in err and "No module named _no_such_server_module" in err


def test_the_command_line_runs_it(log_path: pathlib.Path) -> None:
    with FakeSglang(log_path=log_path) as fake:
        result = subprocess.run(
            [sys.executable, "-m", "sglang.srt.kv_canary.burnin", "--url", fake.url,
             "--server-log", str(log_path), "--duration-s", "2", "--concurrency", "4",
             "--max-new-tokens", "16", "--burst-requests", "4", "--progress-interval-s", "1"],
            capture_output=True, text=True, timeout=120, cwd=_REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== KV canary burn-in ==" in result.stdout and "(exit 0)" in result.stdout
    assert "[kv_canary burnin] progress " in result.stderr
    bad = subprocess.run([sys.executable, "-m", "sglang.srt.kv_canary.burnin", "--url", fake.url,
                          "--seed", "-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--seed='-1' is invalid" in bad.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
