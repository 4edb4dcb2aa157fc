"""``benchmark/bench_mailbox_read.py`` on the CPU (torch reference): every publication is read,
the parts are timed, and a bad ``--reads`` names the option, the value and what is allowed."""

import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import bench_mailbox_read as bench  # noqa: E402


def test_the_benchmark_reads_every_publication_and_times_each_part(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--reads", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("device: cpu (torch reference)")
    assert lines[1].startswith("read with a new publication: median ")
    assert [line.split(":")[0] for line in lines[2:]] == [
        "read, nothing new", "copy of the host buffer", "checksum", "CounterSnapshot",
        "publish (seal + copy)"]


def test_a_bad_reads_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--reads", "1"])
    assert "--reads=1 is invalid; allowed: an integer >= 2" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
