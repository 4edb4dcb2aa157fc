"""``benchmark/bench_graph_replay_host.py``: bad ``--kernels`` / ``--rounds`` name the option, the
value and what is allowed; without a GPU it says so and exits 2; on a GPU it prints the three
graphs and sees the kernel's stores on the host."""

import pathlib
import sys

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")
register_cuda_ci(est_time=10, suite="kv-canary-gpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import bench_graph_replay_host as bench  # noqa: E402


@pytest.mark.parametrize("flag", ["--kernels", "--rounds"])
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
def test_on_a_gpu_it_prints_the_three_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert bench.main(["--kernels", "4", "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("kernel store seen on the host: True")
    assert [line.split()[0] for line in lines[1:]] == ["none", "d2h-copy", "kernel-store"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
