"""Hand cases for the deferred admission check, on the torch reference and the Triton kernel.

A new owner's first forward runs its pre launch with the owner chain unknown (it adopts the
record's chain); the admission launch then checks the host's ``chain(P)`` against the record at
``P - 1``, writes the row the pre launch would have written, and settles the owner chain.
Expectations come from scalar hashing, independently of both implementations.
"""

import sys

import pytest
import torch

from _canary_sim import IMPLS, Violation, admission_impl, chain_at, prefilled
from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_STEP,
    NO_EXPECTED_TOKEN,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.hashing import to_signed_i64
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")
register_cuda_ci(est_time=20, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

TOKENS_A = [11, 12, 13, 14, 15, 16, 17, 18]
TOKENS_B = [21, 22, 23, 24, 25, 26, 27, 28]
PRE, OWNER = int(CheckKind.PRE_VERIFY), int(Reason.VERIFY_OWNER)


def _check(sim, impl, entries: list[tuple[int, int, int]]) -> None:
    def column(index: int) -> torch.Tensor:
        return torch.tensor([entry[index] for entry in entries], dtype=torch.int64,
                            device=sim.device)

    admission_impl(impl).launch_admission_owner_check(
        state=sim.state, req_pool_indices=column(0), prefix_lens=column(1), chains=column(2)
    )
    sim.assert_guards_intact()


def test_the_request_s_own_prefix_passes_and_settles_the_owner_chain(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    sim.state.owner_chains[1] = 1234  # what the pre launch left: the adopted seed + new terms
    seed = chain_at(TOKENS_A, 6)
    _check(sim, impl, [(1, 6, seed)])
    assert sim.violations() == []
    assert sim.owner(1) == 1234


def test_a_foreign_prefix_gives_the_pre_launch_s_row_and_the_request_s_own_chain(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 6)])
    sim.state.counters[COUNTER_STEP] = 7
    sim.state.owner_chains[1] = 1234
    seed = chain_at(TOKENS_A, 6)  # what the records imply
    own = chain_at(TOKENS_B, 6)  # what the request's own tokens give
    _check(sim, impl, [(1, 6, own)])
    slot = sim.requests[1].slots[5]
    assert sim.violations() == [
        Violation(PRE, OWNER, 1, slot, 5, TOKENS_A[5], NO_EXPECTED_TOKEN, seed, own, 7)
    ]
    assert sim.owner(1) == to_signed_i64(1234 + own - seed)


def test_an_empty_prefix_is_checked_against_the_anchor(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 2)])
    _check(sim, impl, [(1, 0, CHAIN_ANCHOR), (2, 0, CHAIN_ANCHOR + 1)])
    assert sim.violations() == [
        Violation(PRE, OWNER, 2, 0, -1, NO_EXPECTED_TOKEN, NO_EXPECTED_TOKEN, CHAIN_ANCHOR,
                  CHAIN_ANCHOR + 1, 1)  # the step after the prefill's
    ]
    assert sim.owner(2) == 1


def test_padding_rows_and_an_empty_launch_do_nothing(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 4)])
    before = sim.state.owner_chains.clone()
    _check(sim, impl, [(0, 3, 99)])
    _check(sim, impl, [])
    assert sim.violations() == []
    assert torch.equal(sim.state.owner_chains, before)


def test_bad_arguments_are_named(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 2)])
    launch = admission_impl(impl).launch_admission_owner_check
    good = torch.zeros(2, dtype=torch.int64, device=sim.device)
    with pytest.raises(TypeError, match="chains has dtype torch.int32"):
        launch(state=sim.state, req_pool_indices=good, prefix_lens=good, chains=good.int())
    with pytest.raises(ValueError, match="prefix_lens has 1 entries but req_pool_indices has 2"):
        launch(state=sim.state, req_pool_indices=good, prefix_lens=good[:1], chains=good)
    with pytest.raises(ValueError, match="req_pool_indices must be a contiguous 1-D tensor"):
        launch(state=sim.state, req_pool_indices=good[None], prefix_lens=good, chains=good)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
