"""``benchmark/bench_kernels.py``'s hybrid sliding-window case (``harness/kernel_cases.py``, the
``+window`` sets of checks): its state is a consistent SWA pool (window slots for the positions
SGLang keeps them for, owners, the windowed sources sized and fingerprinted by window slot), a
pre launch then a post launch of it is a clean forward for the torch reference and, exactly
alike, for the Triton kernels (Triton's interpreter without CUDA), the window checks really run,
the sweep of such a history is clean, the bytes model counts the window's bytes, and the default
run times one window set."""

import dataclasses
import pathlib
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary import sweep_ref
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    ROW_REASONS,
    Reason,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout, CanaryDeviceState
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")
register_cuda_ci(est_time=30, suite="kv-canary-gpu")

_TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS.parent.parent / "benchmark"))
sys.path.insert(0, str(_TESTS / "kernels"))

import bench_kernels  # noqa: E402
from _canary_sim import TRITON_DEVICES, canary_impl  # noqa: E402
from harness import kernel_cases  # noqa: E402
from harness.kernel_cases import CHECKS, SCENARIOS, Checks, Pool, Scenario  # noqa: E402

WINDOW_SETS = tuple(name for name, checks in CHECKS.items() if checks.window)
SMALL_WINDOW = 6  # a window the small scenarios' prefixes outgrow

_SMALL = (
    Scenario(name="decode", layout=BatchLayout.DECODE, rows=3, prefix=40, new=1),
    Scenario(name="extend", layout=BatchLayout.EXTEND, rows=2, prefix=16, new=24),
    Scenario(name="prefill", layout=BatchLayout.EXTEND, rows=2, prefix=0, new=12),
    Scenario(name="contiguous", layout=BatchLayout.DECODE, rows=2, prefix=30, new=1,
             contiguous=True),
)


def _with_window(name: str, window: int) -> Checks:
    return dataclasses.replace(CHECKS[name], window=window)


def _reasons(state: CanaryDeviceState) -> list[int]:
    """The reasons of the ring rows not consumed yet."""
    produced = int(state.counters[COUNTER_VIOLATIONS])
    consumed = int(state.counters[COUNTER_CONSUMED])
    capacity = state.ring.shape[0]
    return [int(state.ring[index % capacity, ROW_REASONS]) for index in range(consumed, produced)]


def _reference_forward(pool: Pool, checks: Checks, *,
                       state: CanaryDeviceState | None = None) -> CanaryDeviceState:
    """A pre launch, the model's writes and a post launch of the torch reference on ``state``
    (default: a fresh :func:`kernel_cases.state_of`); the state after them."""
    reference = canary_impl("reference")
    state = kernel_cases.state_of(pool, checks) if state is None else state
    batch = kernel_cases.batch_of(pool, checks)
    reference.launch_pre_forward(state=state, batch=batch)
    kernel_cases.prepare_post(state, pool)
    reference.launch_post_forward(state=state, batch=batch)
    return state


def test_the_window_sets_are_a_hybrid_pool_of_gpt_oss_s_window() -> None:
    assert set(WINDOW_SETS) == {"partial+window", "all-checks+window"}
    assert {CHECKS[name].window for name in WINDOW_SETS} == {kernel_cases.SWA_WINDOW} == {127}
    assert CHECKS["all-checks+window"].tokens and not CHECKS["partial+window"].tokens
    assert all(not checks.window for name, checks in CHECKS.items() if name not in WINDOW_SETS)


def test_a_window_state_maps_the_positions_sglang_keeps_and_owns_them() -> None:
    scenario = _SMALL[0]  # 3 rows, prefix 40, one new token each
    pool = kernel_cases.build_pool(scenario, device="cpu")
    state = kernel_cases.state_of(pool, _with_window("partial+window", SMALL_WINDOW))
    window = state.window
    assert window is not None and window.window == SMALL_WINDOW
    assert window.windowed_sources == 0b1100
    table = window.slot_table
    assert table.shape[0] == state.num_slots + 1 and int(table[-1]) == -1
    kept = SMALL_WINDOW + 1 + scenario.new  # per row: window + 1 prefix positions, the new ones
    num_window_slots = 1 + scenario.rows * kept
    assert window.num_window_slots == num_window_slots
    assert [source.shape[0] for source in state.real_data.sources] == [
        state.num_slots, state.num_slots, num_window_slots, num_window_slots]
    slots = pool.req_to_token[1:].to(torch.int64)
    window_slots = table[slots]
    first_kept = scenario.prefix - SMALL_WINDOW - 1
    assert bool((window_slots[:, :first_kept] == 0).all())  # SGLang freed the older ones
    live = window_slots[:, first_kept:].flatten()
    assert sorted(live.tolist()) == list(range(1, num_window_slots))  # each window slot once
    prefix_window_slots = window_slots[:, first_kept:scenario.prefix]
    assert torch.equal(window.owners[prefix_window_slots], slots[:, first_kept:scenario.prefix])
    assert bool((window.owners[window_slots[:, scenario.prefix:]] == 0).all())


@pytest.mark.parametrize("window", [SMALL_WINDOW, kernel_cases.SWA_WINDOW])
def test_every_scenario_kind_with_a_window_set_is_a_clean_forward(window: int) -> None:
    long_decode = Scenario(name="long decode", layout=BatchLayout.DECODE, rows=2, prefix=200,
                           new=1)
    for scenario in _SMALL + (long_decode,):
        pool = kernel_cases.build_pool(scenario, device="cpu")
        for name in WINDOW_SETS:
            state = _reference_forward(pool, _with_window(name, window))
            assert _reasons(state) == [], (scenario.name, name, window)
            # the post launch stamped every new slot's window slot with its slot
            new_slots = pool.batch.out_cache_loc
            owners = state.window.owners[state.window.slot_table[new_slots]]
            assert torch.equal(owners, new_slots), (scenario.name, name, window)


def test_a_window_set_with_real_data_all_or_none_or_a_stride_is_clean_too() -> None:
    pool = kernel_cases.build_pool(_SMALL[1], device="cpu")
    for real_data, stride in (("none", 1), ("all", 1), ("partial", 3), ("all", 3)):
        checks = Checks(name="variant", real_data=real_data, stride=stride, window=SMALL_WINDOW)
        assert _reasons(_reference_forward(pool, checks)) == [], (real_data, stride)


def test_the_window_checks_run_on_the_window_state() -> None:
    scenario = _SMALL[0]
    pool = kernel_cases.build_pool(scenario, device="cpu")
    checks = _with_window("partial+window", SMALL_WINDOW)
    in_window = int(pool.req_to_token[1, scenario.prefix - 2])

    state = kernel_cases.state_of(pool, checks)
    state.window.slot_table[in_window] = 0  # the allocator freed an in-window SWA slot
    reasons = _reasons(_reference_forward(pool, checks, state=state))
    assert reasons and all(reason == int(Reason.VERIFY_WINDOW_UNMAPPED) for reason in reasons)

    state = kernel_cases.state_of(pool, checks)
    # the window slot's owner is another slot (the allocator handed it out twice)
    state.window.owners[state.window.slot_table[in_window]] = in_window + 1
    reasons = _reasons(_reference_forward(pool, checks, state=state))
    assert reasons and all(reason == int(Reason.VERIFY_WINDOW_OWNER) for reason in reasons)

    def flip_windowed_byte(state: CanaryDeviceState, position: int) -> None:
        window_slot = state.window.slot_table[int(pool.req_to_token[1, position])]
        for source in state.real_data.sources[2:]:
            source[window_slot] ^= 1 << 7

    all_data = _with_window("partial+window", SMALL_WINDOW)
    all_data = dataclasses.replace(all_data, real_data="all")
    state = kernel_cases.state_of(pool, all_data)
    flip_windowed_byte(state, scenario.prefix - 2)
    assert _reasons(_reference_forward(pool, all_data, state=state)) == [
        int(Reason.VERIFY_REAL_KV)]
    state = kernel_cases.state_of(pool, all_data)
    flip_windowed_byte(state, scenario.prefix - SMALL_WINDOW - 1)  # kept, but out of the window
    assert _reasons(_reference_forward(pool, all_data, state=state)) == []


@pytest.mark.parametrize("window", [SMALL_WINDOW, kernel_cases.SWA_WINDOW])
def test_the_sweep_of_a_clean_window_history_reports_nothing(window: int) -> None:
    scenario = Scenario(name="sweep", layout=BatchLayout.EXTEND, rows=1, prefix=200, new=0)
    pool = kernel_cases.build_pool(scenario, device="cpu")
    window_sweeps = [name for name in kernel_cases.SWEEP_CHECKS if CHECKS[name].window]
    assert window_sweeps == ["partial+window"]
    for name in window_sweeps:
        state = kernel_cases.state_of(pool, _with_window(name, window))
        sweep_ref.launch_sweep(state=state, entries=kernel_cases.sweep_entries(pool))
        assert _reasons(state) == [], name


def _assert_same(expected: CanaryDeviceState, actual: CanaryDeviceState) -> None:
    assert torch.equal(expected.records.cpu(), actual.records.cpu()), "records differ"
    assert torch.equal(expected.window.owners.cpu(), actual.window.owners.cpu()), "owners differ"
    assert torch.equal(expected.counters.cpu(), actual.counters.cpu()), "counters differ"
    assert torch.equal(expected.owner_chains.cpu(), actual.owner_chains.cpu()), "owner chains"


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("name", WINDOW_SETS)
def test_the_triton_kernels_run_the_window_forward_clean_like_the_reference(
        device: str, name: str) -> None:
    reference, kernels = canary_impl("reference"), canary_impl("triton")
    checks = _with_window(name, SMALL_WINDOW)
    for scenario in (
            Scenario(name="decode", layout=BatchLayout.DECODE, rows=2, prefix=20, new=1),
            Scenario(name="extend", layout=BatchLayout.EXTEND, rows=2, prefix=12, new=5)):
        pool = kernel_cases.build_pool(scenario, device=device)
        expected = kernel_cases.state_of(pool, checks)
        actual = kernel_cases.clone_state(expected)  # shares the pool: sources, window table
        batch = kernel_cases.batch_of(pool, checks)
        reference.launch_pre_forward(state=expected, batch=batch)
        kernels.launch_pre_forward(state=actual, batch=batch)
        _assert_same(expected, actual)
        kernel_cases.prepare_post(expected, pool)
        kernel_cases.prepare_post(actual, pool)  # the model's rows both post launches read
        reference.launch_post_forward(state=expected, batch=batch)
        kernels.launch_post_forward(state=actual, batch=batch)
        _assert_same(expected, actual)
        assert _reasons(expected) == [] and int(actual.counters[COUNTER_VIOLATIONS]) == 0, (
            scenario.name)


def test_the_bound_counts_the_window_s_bytes() -> None:
    base = kernel_cases.REQ_TO_TOKEN_BYTES + kernel_cases.RECORD_BYTES
    partial, windowed = CHECKS["partial"], CHECKS["partial+window"]
    window_entry = kernel_cases.WINDOW_TABLE_BYTES + kernel_cases.WINDOW_OWNER_BYTES
    assert kernel_cases.slot_bytes(windowed, launch="post", in_window=True) == (
        base + 16 + window_entry)
    # out of the window: the windowed half of the sources is not read, nor the table
    assert kernel_cases.slot_bytes(windowed, launch="post") == base + 8
    assert kernel_cases.slot_bytes(windowed, launch="sweep") == (
        base + 16 * 2 + kernel_cases.WINDOW_TABLE_BYTES)
    assert kernel_cases.slot_bytes(partial, launch="post", in_window=True) == base + 16
    scenario = SCENARIOS["decode 64 x 8k"]  # prefix 8192, one new token per row
    assert kernel_cases.window_positions(scenario, windowed, launch="pre") == 127
    assert kernel_cases.window_positions(scenario, windowed, launch="post") == 128
    assert kernel_cases.window_positions(scenario, windowed, launch="sweep") == 128
    assert kernel_cases.window_positions(scenario, partial, launch="post") == 0
    assert kernel_cases.launch_bytes(scenario, windowed, launch="post") == 64 * (
        128 * (base + 16 + window_entry) + (8193 - 128) * (base + 8))
    pre_record = kernel_cases.REQ_TO_TOKEN_BYTES + 16
    new_token = (kernel_cases.TOKEN_INPUT_BYTES + kernel_cases.RECORD_BYTES
                 + kernel_cases.LANDING_BYTES * kernel_cases.NUM_SOURCES
                 + kernel_cases.WINDOW_TABLE_BYTES)
    assert kernel_cases.launch_bytes(scenario, windowed, launch="pre") == 64 * (
        127 * (pre_record + window_entry) + (8192 - 127) * pre_record + new_token)
    short = SCENARIOS["prefill 64 x 512"]  # no prefix: every new position is in the window
    assert kernel_cases.launch_bytes(short, windowed, launch="post") == 64 * 512 * (
        base + 16 + window_entry)


def test_the_default_run_times_one_window_set_and_every_window_set_is_selectable() -> None:
    default = bench_kernels.parse_args([]).checks
    assert [name for name in default if CHECKS[name].window] == ["partial+window"]
    assert set(default) == {name for name in CHECKS if name != "all-checks+window"}
    chosen = bench_kernels.parse_args(["--checks", "partial+window,all-checks+window"]).checks
    assert chosen == ("partial+window", "all-checks+window")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
