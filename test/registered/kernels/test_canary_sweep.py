"""Hand cases for the sweep launch, on the torch reference and the Triton kernel.

The sweep checks slots the host lists (every slot the radix cache holds), with what each must
hold; expectations come from scalar hashing, independently of both implementations.
"""

import sys

import pytest
import torch

from _canary_sim import (
    IMPLS,
    Violation,
    chain_at,
    expected_counters,
    prefilled,
    sweep_impl,
)
from sglang.jit_kernel.kv_canary.consts import FIELD_CHAIN, CheckKind, Reason
from sglang.jit_kernel.kv_canary.hashing import chain_term_scalar, to_signed_i64
from sglang.jit_kernel.kv_canary.kernel_inputs import SweepEntries
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")
register_cuda_ci(est_time=30, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

SWEEP = CheckKind.SWEEP
TOKENS_A = [11, 12, 13, 14, 15, 16, 17, 18, 19]
TOKENS_B = [21, 22, 23, 24, 25, 26, 27, 28, 29]


def _entries(sim, rp, *, known_tokens=True, **changes) -> SweepEntries:
    """Entries of every slot of request ``rp``, with ``changes`` (name -> {index: value})."""
    slots = list(sim.requests[rp].slots)
    columns = {
        "slots": slots,
        "prev_slots": [-1] + slots[:-1],
        "positions": list(range(len(slots))),
        "tokens": sim.requests[rp].tokens[: len(slots)] if known_tokens else [-1] * len(slots),
    }
    for name, edits in changes.items():
        for index, value in edits.items():
            columns[name][index] = value
    return SweepEntries(
        **{
            name: torch.tensor(values, dtype=torch.int64, device=sim.device)
            for name, values in columns.items()
        }
    )


def _sweep(sim, impl, entries):
    sweep_impl(impl).launch_sweep(state=sim.state, entries=entries)
    sim.assert_guards_intact()


def test_a_clean_sweep_counts_its_run_and_entries(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 6), (TOKENS_B, 4)], real_data="all")
    _sweep(sim, impl, _entries(sim, 1))
    _sweep(sim, impl, _entries(sim, 2, known_tokens=False))
    assert sim.violations() == []
    assert sim.counters() == expected_counters(
        pre=1, verified_post=10, written=10, sweeps=2, swept=10
    )


def test_an_empty_sweep_still_counts_its_run(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 2)])
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    _sweep(sim, impl, SweepEntries(slots=empty, prev_slots=empty, positions=empty, tokens=empty))
    assert sim.counters() == expected_counters(pre=1, verified_post=2, written=2, sweeps=1)


def test_each_reason(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 8)], real_data="partial")
    slots = sim.requests[1].slots
    sim.state.records[slots[3], FIELD_CHAIN] += 5
    sim.sources[0][slots[6]] ^= 1 << 20  # both partial words of the first source
    entries = _entries(
        sim,
        1,
        slots={1: 0},  # unmapped
        positions={2: 9},  # the slot does not hold position 9
        tokens={5: 99},  # nor token 99
        prev_slots={7: 0},  # predecessor unknown: the chain is not checked
    )
    _sweep(sim, impl, entries)
    chain = [chain_at(TOKENS_A, p) for p in range(9)]
    assert sim.violations() == sorted([
        Violation(SWEEP, Reason.VERIFY_UNMAPPED, 0, 0, 1, -1, -1, 0, 0, 1),
        Violation(SWEEP, Reason.VERIFY_POSITION, 0, slots[2], 9, TOKENS_A[2], TOKENS_A[2],
                  chain[2], chain[2], 1),
        Violation(SWEEP, Reason.VERIFY_CHAIN, 0, slots[3], 3, TOKENS_A[3], TOKENS_A[3],
                  chain[3] + 5, chain[3], 1),
        Violation(SWEEP, Reason.VERIFY_CHAIN, 0, slots[4], 4, TOKENS_A[4], TOKENS_A[4], chain[4],
                  to_signed_i64(chain[3] + 5 + chain_term_scalar(TOKENS_A[3], 3)), 1),
        Violation(SWEEP, Reason.VERIFY_TOKEN, 0, slots[5], 5, TOKENS_A[5], 99, chain[5],
                  chain[5], 1),
        Violation(SWEEP, Reason.VERIFY_REAL_KV, 0, slots[6], 6, TOKENS_A[6], TOKENS_A[6],
                  chain[6], chain[6], 1),
    ])
    assert sim.counters()[3 + 4 + SWEEP] == 7


def test_the_anchor_and_an_empty_record(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 3)])
    slots = sim.requests[1].slots
    out_of_range = sim.num_slots + 5
    entries = _entries(sim, 1, known_tokens=False, prev_slots={1: -1}, slots={2: out_of_range})
    _sweep(sim, impl, entries)
    chain1 = chain_at(TOKENS_A, 1)
    assert sim.violations() == sorted([
        # position 1 claimed to be a history's first slot: its chain is not the anchor
        Violation(SWEEP, Reason.VERIFY_CHAIN, 0, slots[1], 1, TOKENS_A[1], -1, chain1,
                  chain_at([], 0), 1),
        Violation(SWEEP, Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN, 0, out_of_range, 2, 0, -1,
                  0, chain_at(TOKENS_A, 2), 1),
    ])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
