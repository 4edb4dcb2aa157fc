"""``benchmark/profile_prefill.py`` without a GPU: its GPU figures (busy time, the canary's
kernels, the idle gaps where the device waited for the host) and its host timeline (the
scheduler thread's calls before the first GEMM launch, nested by time) on a synthetic trace,
and its usage errors."""

import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))  # the script imports its sibling modules by name

import profile_prefill as prefill  # noqa: E402
import profile_server_step as profiler  # noqa: E402


def _trace() -> profiler.Trace:
    gpu = (
        profiler.GpuEvent(name="copy", kind="memcpy", ts_us=0.0, dur_us=10.0, correlation=1),
        # the device waits 990 µs for the host, then runs the canary's pre launch
        profiler.GpuEvent(name="_canary_forward_kernel", kind="kernel", ts_us=1000.0,
                          dur_us=20.0, correlation=2),
        profiler.GpuEvent(name="nvjet_gemm", kind="kernel", ts_us=1100.0, dur_us=500.0,
                          correlation=3),
    )
    launches = (profiler.Launch(name="cudaLaunchKernel", ts_us=1050.0, correlation=3,
                                thread="7:7"),)
    python = (
        profiler.PyEvent(name="scheduler.py(1): run_batch", thread="7:7", ts_us=0.0,
                         dur_us=2000.0),
        profiler.PyEvent(name="forward_batch_info.py(2): init_new", thread="7:7", ts_us=10.0,
                         dur_us=900.0),
        profiler.PyEvent(name="kv_canary/runner/canary_runner.py(3): on_init_new",
                         thread="7:7", ts_us=300.0, dur_us=600.0),
        profiler.PyEvent(name="other.py(4): elsewhere", thread="8:8", ts_us=0.0, dur_us=5000.0),
    )
    return profiler.Trace(gpu_events=gpu, launches=launches, python_events=python)


def test_gpu_lines_show_the_canary_kernels_and_where_the_device_waited() -> None:
    lines, totals = prefill.gpu_lines(_trace())
    assert lines[0] == ("   GPU events 3, busy 0.53 ms, span 1.60 ms, kernel sum 0.53 ms, "
                        "canary kernels 0.020 ms")
    assert lines[1] == "   canary      20.0 us x1    _canary_forward_kernel"
    assert lines[-1] == ("   GPU idle gaps > 0.3 ms (ms, at ms, before, after): "
                         "[(0.99, 0.0, 'copy', '_canary_forward_kernel')]")
    assert totals["nvjet_gemm"] == 500.0


def test_host_lines_nest_the_scheduler_calls_before_the_first_gemm() -> None:
    lines = prefill.host_lines(_trace())
    assert "thread 7:7" in lines[0]
    assert lines[1:4] == [
        "      -1.05    2.00 scheduler.py(1): run_batch",
        "      -1.04    0.90   forward_batch_info.py(2): init_new",
        "      -0.75    0.60     kv_canary/runner/canary_runner.py(3): on_init_new",
    ]
    # keys match by substring and nested calls count again: "init_new" holds on_init_new too
    assert lines[-1].endswith("{'run_batch': 1.05, 'init_new': 1.5, 'kv_canary': 0.6}")
    no_gemm = profiler.Trace(gpu_events=_trace().gpu_events[:2], launches=(), python_events=())
    assert prefill.host_lines(no_gemm) == ["   host: no first GEMM launch found"]


def test_bad_arguments_print_the_usage_or_the_allowed_configurations(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert prefill.main(["out"]) == 2
    assert "usage: python benchmark/profile_prefill.py" in capsys.readouterr().err
    assert prefill.main(["out", "off", "gpu"]) == 2
    assert prefill.main(["out", "off,nope"]) == 2
    assert "unknown configurations ['nope']; allowed: off," in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
