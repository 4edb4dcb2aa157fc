"""``benchmark/pre_touch_memory.py``: MemTotal is read from meminfo text, a small touch runs and
reports, a bad size names the option, the value and what is allowed."""

import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import pre_touch_memory  # noqa: E402


def test_mem_total_comes_from_meminfo() -> None:
    text = "MemTotal:       32768000 kB\nMemFree:        1000 kB\n"
    assert pre_touch_memory.mem_total_kib(text) == 32768000
    assert pre_touch_memory.mem_total_kib("MemFree: 1 kB\n") is None


def test_a_small_touch_reports_what_it_did(capsys: pytest.CaptureFixture[str]) -> None:
    assert pre_touch_memory.main(["--gib", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pre-touch: 0.01 GiB written and freed in ")
    assert "MemTotal" in out and " before, " in out


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_bad_size_names_the_option(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        pre_touch_memory.main(["--gib", value])
    assert stopped.value.code == 2
    assert f"--gib={float(value)} is invalid; allowed: > 0" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
