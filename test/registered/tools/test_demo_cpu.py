"""The main job (``python -m sglang.srt.kv_canary.demo``) where no GPU is visible, its self-check
dispatch, its workload and its verdict on a parsed log."""

import importlib.util
import os
import subprocess
import sys

import pytest

from sglang.srt.kv_canary import demo
from sglang.srt.kv_canary.tools.canary_log import parse_canary_log
from sglang.srt.kv_canary.tools.tiny_model import FIRST_ORDINARY_TOKEN_ID
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="kv-canary-cpu")


def test_without_a_gpu_the_demo_says_so_and_runs_the_self_check() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_KV_CANARY_")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # also on a GPU host: this test is about the CPU branch
    result = subprocess.run([sys.executable, "-m", "sglang.srt.kv_canary.demo"], env=env,
                            capture_output=True, text=True, timeout=900)
    assert "no CUDA GPU visible: running the CPU self-check instead" in result.stdout
    if importlib.util.find_spec(demo.SELFCHECK_MODULE) is None:
        assert result.returncode == demo.EXIT_NO_SELFCHECK, result.stdout + result.stderr
        assert "is not installed" in result.stdout
    else:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_self_check_exit_code_is_passed_through(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "fake_selfcheck_module.py").write_text(
        "import os, sys\nsys.exit(7 if os.environ.get('TRITON_INTERPRET') == '1' else 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert demo.run_cpu_selfcheck(module="fake_selfcheck_module") == 7
    assert demo.run_cpu_selfcheck(module="no_such_selfcheck_module") == demo.EXIT_NO_SELFCHECK
    assert "no_such_selfcheck_module) is not installed" in capsys.readouterr().out


def test_workload_mixes_shared_prefixes_long_prompts_text_and_repeats() -> None:
    workload = demo.build_workload(num_requests=48, vocab_size=4096, context_length=4096)
    assert workload == demo.build_workload(num_requests=48, vocab_size=4096, context_length=4096)
    assert len({p["rid"] for p in workload}) == 48
    with_ids = [p["input_ids"] for p in workload if "input_ids" in p]
    assert all(FIRST_ORDINARY_TOKEN_ID <= t < 4096 for ids in with_ids for t in ids)
    for payload in workload:
        params = payload["sampling_params"]
        assert params["temperature"] == 0.0 and params["ignore_eos"] is True
        assert len(payload.get("input_ids", ())) + params["max_new_tokens"] < 4096
    shared = [p["input_ids"][:256] for i, p in enumerate(workload) if i % 8 == 0]
    assert len(shared) == 6 and all(ids == shared[0] for ids in shared)
    assert all(len(p["input_ids"]) >= 1500 for i, p in enumerate(workload) if i % 8 == 3)
    assert sum("text" in p for p in workload) == 12
    for index in range(7, 48, 8):
        original, repeat = workload[index - 7], workload[index]
        assert repeat["input_ids"] == original["input_ids"] and repeat["rid"] != original["rid"]
    with pytest.raises(ValueError, match="num_requests=0"):
        demo.build_workload(num_requests=0)


@pytest.mark.parametrize(
    "argv,fragment",
    [(["--requests", "0"], "--requests=0"), (["--port", "70000"], "--port=70000"),
     (["--ready-timeout-s", "0"], "--ready-timeout-s=0.0")],
)
def test_bad_options_are_refused_by_name(argv, fragment, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        demo.main(argv)
    assert exit_info.value.code == 2 and fragment in capsys.readouterr().err


def _clean_lines(*, protected: int) -> str:
    """A stats line (``protected`` slot verifications) and a passed health check, formatted by
    the canary's own modules."""
    from sglang.jit_kernel.kv_canary import consts
    from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
    from sglang.srt.kv_canary.monitor.health import HealthChecker
    from sglang.srt.kv_canary.monitor.stats import stats_line

    counters = [0] * consts.NUM_COUNTERS
    counters[consts.COUNTER_ENTRIES + consts.CheckKind.PRE_VERIFY] = protected
    snapshot = CounterSnapshot(steps=8, launches=0, sweep_launches=0, counters=tuple(counters))
    health = HealthChecker(every_n_steps=8).check(steps=8, latest=snapshot)
    return f"[t TP0] {stats_line(snapshot)}\n[t TP0] {health}\n"


def test_verdict_needs_the_startup_line_verified_slots_a_passed_health_check_and_no_violation(
    capsys,
) -> None:
    """Success needs proof the canary checked something: a stats line with slots verified and a
    passed health check (a start-up line and no violation used to be enough)."""
    startup = "[t TP0] KV canary enabled: mode=log token_oracle=on\n"
    assert demo.report(parse_canary_log(startup + _clean_lines(protected=120))) == demo.EXIT_CLEAN
    assert "RESULT: no violation (120 slot verifications, 1 health checks passed)" in (
        capsys.readouterr().out
    )
    for log in (
        startup + "KV canary stats: violations=0\n",  # no slot verified, no health check
        startup + _clean_lines(protected=0),  # the health check passed but nothing was verified
        startup + _clean_lines(protected=120).splitlines(keepends=True)[0],  # no health check
    ):
        assert demo.report(parse_canary_log(log)) == demo.EXIT_VIOLATIONS
        assert "RESULT: no proof the canary checked anything" in capsys.readouterr().out
    violation = "kv_canary violation: check=post_verify slot_idx=3\n"
    assert demo.report(parse_canary_log(startup + _clean_lines(protected=120) + violation)) == (
        demo.EXIT_VIOLATIONS
    )
    assert "RESULT: 1 violation(s)" in capsys.readouterr().out
    assert demo.report(parse_canary_log("nothing here\n")) == demo.EXIT_VIOLATIONS
    assert "the canary did not start" in capsys.readouterr().out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
