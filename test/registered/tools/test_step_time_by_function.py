"""``benchmark/step_time_by_function.py`` on a synthetic ``--out`` file: each server is paired
with its baseline's server of the same run, every once-per-step function is listed with its
µs per forward in both and the difference, the client's step time under them; idle-loop and
per-mode entries are left out unless asked; bad input names what is wrong."""

import json
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import step_time_by_function as script  # noqa: E402
from server_overhead_table import ConfigResult, WorkloadResult  # noqa: E402
from server_workloads import RoundTiming  # noqa: E402


def _server(config: str, run: int, timers: str, decode_s: float) -> dict:
    timing = RoundTiming(wall_s=1.0, ttft_s=(0.01,), decode_s=decode_s, new_tokens=11,
                         prompt_tokens=128, output_tokens=11)
    workload = WorkloadResult(workload="bs1", status="measured", rounds=(timing,),
                              host_timers=f"KV canary host timers over 400 forwards: {timers}")
    return ConfigResult(config=config, status="measured", run=run,
                        workloads={"bs1": workload}).to_json()


def _document() -> dict:
    off = "Scheduler.run_batch 900.0us x1.00, Scheduler.recv_requests 20.0us x50.00, " \
          "Sampler.forward 30.0us x1.00"
    checks = ("Scheduler.run_batch 1000.0us x1.00, Scheduler.recv_requests 21.0us x40.00, "
              "CanaryRunner.on_init_new 60.0us x1.00, CanaryRunner.on_init_new[DECODE] "
              "60.0us x1.00, OracleSampler.forward 40.0us x1.00")
    return {
        "options": {"workloads": ["bs1"]},
        "configs": {"off": {"baseline": "stock"}, "all-checks": {"baseline": "off"}},
        "models": {"tiny": {"results": [
            _server("off", 1, off, 0.010), _server("all-checks", 1, checks, 0.012),
            _server("off", 2, off.replace("900.0", "880.0"), 0.010),
            _server("all-checks", 2, checks, 0.0115),
        ]}},
    }


def test_each_server_is_read_against_its_baselines_server_of_the_same_run() -> None:
    text = script.report(_document(), model=None, workloads=None, min_calls=0.5,
                         max_calls=1.5, modes=False)
    blocks = text.split("\n\n")
    assert [block.splitlines()[0] for block in blocks] == [
        "[tiny] bs1: all-checks against off, µs per forward (mean per call x calls per forward)",
        "[tiny] bs1: all-checks#2 against off#2, µs per forward (mean per call x calls per "
        "forward)",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in blocks[1].splitlines()[2:]}
    assert rows["Scheduler.run_batch"] == ["880.0", "1000.0", "+120.0"]
    assert rows["Sampler.forward"] == ["30.0", "0.0", "-30.0"]
    assert rows["CanaryRunner.on_init_new"] == ["0.0", "60.0", "+60.0"]
    assert rows["client"] == ["step", "(median", "of", "rounds)", "1000.0", "1150.0", "+150.0"]
    assert "Scheduler.recv_requests" not in rows  # the idle loop's, 40-50 calls per forward
    assert "CanaryRunner.on_init_new[DECODE]" not in rows


def test_per_mode_entries_and_other_call_counts_on_request() -> None:
    text = script.report(_document(), model="tiny", workloads=["bs1"], min_calls=0.0,
                         max_calls=100.0, modes=True)
    assert "CanaryRunner.on_init_new[DECODE]" in text and "Scheduler.recv_requests" in text


def test_the_script_reads_a_file_and_refuses_what_it_cannot_read(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_document()), encoding="utf-8")
    assert script.main([str(path), "--workloads", "bs1"]) == 0
    assert "all-checks#2 against off#2" in capsys.readouterr().out
    assert script.main([str(path), "--model", "8b"]) == 2
    assert "not a bench_server_overhead.py --out file with that model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main([str(path), "--min-calls", "2", "--max-calls", "1"])
    assert "allowed: 0 <= --min-calls <= --max-calls" in capsys.readouterr().err


def test_a_malformed_timer_entry_is_named() -> None:
    with pytest.raises(ValueError, match="not a host-timer entry: 'Scheduler.run_batch 9'"):
        script.parse_timer_line("KV canary host timers over 4 forwards: Scheduler.run_batch 9")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
