"""``benchmark/bench_canary_kernels.py`` times what it claims: every scenario it builds is a clean
forward (no violation from either launch, kernels and references alike, in every mode), and its
``partial+tokens`` mode really runs the token checks (a wrong history entry is reported).
Small shapes of the benchmark's own scenario kinds; the timers are not exercised here."""

import pathlib
import sys

import pytest
from _canary_sim import TRITON_DEVICES, canary_impl

from sglang.jit_kernel.kv_canary.consts import COUNTER_VIOLATIONS
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")
register_cuda_ci(est_time=10, suite="kv-canary-gpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))


@pytest.fixture
def bench(monkeypatch, request):
    canary_impl("triton")  # the kernels interpreted where there is no CUDA, before the import
    import bench_canary_kernels

    monkeypatch.setattr(bench_canary_kernels, "DEVICE", request.param)
    return bench_canary_kernels


def _scenarios(bench):
    return (
        bench.Scenario(name="decode", layout=bench.BatchLayout.DECODE, bs=3, prefix=40, new=1),
        bench.Scenario(name="extend", layout=bench.BatchLayout.EXTEND, bs=2, prefix=16, new=24),
    )


def _forward(bench, pool, mode: str, impl: str) -> int:
    module = canary_impl(impl)
    state, batch = bench.state_of(pool, mode), bench.batch_of(pool, mode)
    module.launch_pre_forward(state=state, batch=batch)
    state.owner_chains.copy_(pool.owners_after)
    module.launch_post_forward(state=state, batch=batch)
    return int(state.counters[COUNTER_VIOLATIONS])


@pytest.mark.parametrize("bench", TRITON_DEVICES, indirect=True)
def test_every_scenario_and_mode_is_a_clean_forward(bench) -> None:
    for scenario in _scenarios(bench):
        pool = bench.build_pool(scenario)
        for mode in bench.MODES:
            for impl in ("triton", "reference"):
                assert _forward(bench, pool, mode, impl) == 0, (scenario.name, mode, impl)


@pytest.mark.parametrize("bench", TRITON_DEVICES, indirect=True)
def test_the_tokens_mode_runs_the_token_checks(bench) -> None:
    pool = bench.build_pool(_scenarios(bench)[0])
    pool.token_history[1, 5] += 1  # row 1's history disagrees with its records at position 5
    assert _forward(bench, pool, "partial", "triton") == 0
    assert _forward(bench, pool, "partial+tokens", "triton") > 0
    assert bench.launch_bytes(pool.scenario, "partial+tokens", "pre") > bench.launch_bytes(
        pool.scenario, "partial", "pre")


@pytest.mark.parametrize("bench", ["cpu"], indirect=True)
def test_the_bound_counts_what_each_launch_reads(bench) -> None:
    """Per verified slot: the pre launch reads no real data; the post launch with ``partial``
    the 16 bytes of the one due source; the sweep every source's 16 bytes."""
    entry_and_record = bench.REQ_TO_TOKEN_BYTES + bench.RECORD_BYTES
    assert bench.slot_bytes("partial", launch="pre") == bench.slot_bytes("none", launch="pre")
    assert bench.slot_bytes("partial", launch="post") == entry_and_record + 16
    assert bench.slot_bytes("partial/4+tokens", launch="post") == (
        entry_and_record + 16 // 4 + bench.HISTORY_BYTES
    )
    assert bench.slot_bytes("partial", launch="sweep") == entry_and_record + 16 * bench.NUM_SOURCES


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
