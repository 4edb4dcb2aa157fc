"""``benchmark/bench_kernels.py`` times what it claims: each scenario kind it builds
(``harness/kernel_cases.py``) is a clean forward for the torch reference with every set of checks,
its ``all-checks`` set really runs the token checks, the bytes model counts what each launch
reads, and without CUDA the script refuses with exit status 2. On a GPU (marker ``gpu``) a small
run writes its result set with no violation."""

import dataclasses
import json
import pathlib
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary import append_history_ref, canary_forward_ref, sweep_ref
from sglang.jit_kernel.kv_canary.consts import COUNTER_VIOLATIONS
from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")
register_cuda_ci(est_time=60, suite="kv-canary-gpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

import bench_kernels  # noqa: E402
from harness import kernel_cases  # noqa: E402
from harness.kernel_cases import CHECKS, SCENARIOS, Scenario  # noqa: E402

_SMALL = (
    Scenario(name="decode", layout=BatchLayout.DECODE, rows=3, prefix=40, new=1),
    Scenario(name="extend", layout=BatchLayout.EXTEND, rows=2, prefix=16, new=24),
    Scenario(name="contiguous", layout=BatchLayout.DECODE, rows=2, prefix=30, new=1,
             contiguous=True),
)


def _forward_violations(pool: kernel_cases.Pool, checks: kernel_cases.Checks) -> int:
    state, batch = kernel_cases.state_of(pool, checks), kernel_cases.batch_of(pool, checks)
    canary_forward_ref.launch_pre_forward(state=state, batch=batch)
    kernel_cases.prepare_post(state, pool)
    canary_forward_ref.launch_post_forward(state=state, batch=batch)
    return int(state.counters[COUNTER_VIOLATIONS])


def test_every_scenario_kind_and_set_of_checks_is_a_clean_forward() -> None:
    for scenario in _SMALL:
        pool = kernel_cases.build_pool(scenario, device="cpu")
        for checks in CHECKS.values():
            assert _forward_violations(pool, checks) == 0, (scenario.name, checks.name)


def test_the_every_check_set_runs_the_token_checks() -> None:
    pool = kernel_cases.build_pool(_SMALL[0], device="cpu")
    pool.token_history[1, 5] += 1  # row 1's history disagrees with its records at position 5
    assert _forward_violations(pool, CHECKS["partial"]) == 0
    assert _forward_violations(pool, CHECKS["all-checks"]) > 0


def test_the_sweep_of_a_clean_history_reports_nothing() -> None:
    scenario = Scenario(name="sweep", layout=BatchLayout.EXTEND, rows=1, prefix=64, new=0)
    pool = kernel_cases.build_pool(scenario, device="cpu")
    for name in kernel_cases.SWEEP_CHECKS:
        state = kernel_cases.state_of(pool, CHECKS[name])
        sweep_ref.launch_sweep(state=state, entries=kernel_cases.sweep_entries(pool))
        assert int(state.counters[COUNTER_VIOLATIONS]) == 0, name


def test_the_append_inputs_append_every_row_s_sampled_token() -> None:
    pool = kernel_cases.build_pool(_SMALL[0], device="cpu")
    inputs = kernel_cases.append_inputs(pool)
    launch = append_history_ref.bind_append_history_tokens(
        pool_out=inputs.pool_out, history_lens_out=inputs.history_lens_out)
    launch(req_pool_indices=inputs.req_pool_indices, seq_lens=inputs.seq_lens,
           tokens=inputs.tokens)
    length = pool.token_history.shape[1]
    assert inputs.pool_out[1:, length].tolist() == inputs.tokens.tolist()
    assert inputs.history_lens_out[1:].tolist() == [length + 1] * 3


def test_the_bound_counts_what_each_launch_reads() -> None:
    entry_and_record = kernel_cases.REQ_TO_TOKEN_BYTES + kernel_cases.RECORD_BYTES
    partial, every = CHECKS["partial"], CHECKS["all-checks"]
    assert kernel_cases.slot_bytes(partial, launch="pre") == kernel_cases.slot_bytes(
        CHECKS["none"], launch="pre")
    assert kernel_cases.slot_bytes(partial, launch="post") == entry_and_record + 16
    assert kernel_cases.slot_bytes(every, launch="post") == (
        entry_and_record + 16 + kernel_cases.HISTORY_BYTES)
    quarter = dataclasses.replace(partial, stride=4)
    assert kernel_cases.slot_bytes(quarter, launch="post") == entry_and_record + 4
    assert kernel_cases.slot_bytes(partial, launch="sweep") == (
        entry_and_record + 16 * kernel_cases.NUM_SOURCES)
    scenario = SCENARIOS["decode 64 x 8k"]
    assert kernel_cases.launch_bytes(scenario, every, launch="pre") > kernel_cases.launch_bytes(
        scenario, partial, launch="pre")
    assert kernel_cases.launch_bytes(scenario, partial, launch="post") == (
        64 * 8193 * (entry_and_record + 16))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_the_script_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_kernels.main(["--no-reference"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_small_run_on_a_gpu_writes_its_result_set(tmp_path: pathlib.Path) -> None:
    assert bench_kernels.main(["--scenarios", "decode 1 x 1k,prefill 64 x 512", "--checks",
                               "none,all-checks", "--no-sweep", "--out", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "kernels.json").read_text())
    launches = document["launches"]
    # pre and post of two scenarios with two sets of checks, and the decode's append
    assert [launch["launch"] for launch in launches] == ["pre", "post", "pre", "post", "append",
                                                         "pre", "post", "pre", "post"]
    assert all(launch["unexpected_violations"] == 0 for launch in launches)
    assert all(launch["graph_us"]["median"] > 0 and launch["reference_us"] > 0
               for launch in launches)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
