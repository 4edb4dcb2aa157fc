"""``benchmark/bench_upload_copy.py``: bad ``--rounds`` / ``--calls`` name the option, the value
and what is allowed; without a GPU it says so and exits 2; on a GPU it prints both batch sizes'
row with the three ways and their ratio."""

import pathlib
import sys

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")
register_cuda_ci(est_time=5, suite="kv-canary-gpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import bench_upload_copy as bench  # noqa: E402


@pytest.mark.parametrize("flag", ["--rounds", "--calls"])
def test_a_bad_count_is_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main([flag, "0"])
    assert f"{flag}=0 is invalid; allowed: an integer >= 1" in capsys.readouterr().err


def test_without_a_gpu_it_says_so(capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_a_gpu_it_prints_both_rows(capsys: pytest.CaptureFixture[str]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert bench.main(["--rounds", "2", "--calls", "50"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[:2] for row in rows] == [["1", "7"], ["64", "322"]]
    assert all(len(row) == 9 and float(row[-1]) > 0 for row in rows)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
