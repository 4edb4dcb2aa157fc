"""Hand cases for the owner-chain resync after an EAGLE verification, on the torch reference
and the Triton kernel.

A target-verify (or draft-extend) forward writes a block of ``D`` tokens per row and its pre
launch advances the owner chain over all of them; the verification keeps the first
``accept_lens[b]``. The resync sets each row's owner chain to the chain after its last kept
token, read from the record the forward wrote. Expectations come from scalar hashing,
independently of both implementations.
"""

import sys

import pytest
import torch

from _canary_sim import IMPLS, accepted_owner_impl, chain_at, prefilled
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")
register_cuda_ci(est_time=20, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

TOKENS_A = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
TOKENS_B = [21, 22, 23, 24, 25, 26, 27, 28, 29, 30]
BLOCK = 3


def _verify_block(sim, launches, rows: list[int]) -> torch.Tensor:
    """One forward writing ``BLOCK`` tokens for each of ``rows``; its out_cache_loc."""
    batch = sim.extend_batch([(rp, BLOCK) for rp in rows])
    sim.forward(launches, batch)
    return batch.out_cache_loc.to(torch.int64).contiguous()


def _resync(sim, impl, *, rows, out_cache_loc, accept_lens, dtype=torch.int32) -> None:
    accepted_owner_impl(impl).launch_accepted_owner_resync(
        state=sim.state,
        req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=sim.device),
        out_cache_loc=out_cache_loc,
        accept_lens=torch.tensor(accept_lens, dtype=dtype, device=sim.device),
        block=BLOCK,
    )
    sim.assert_guards_intact()


@pytest.mark.parametrize("accepted", [1, 2, 3])
def test_the_owner_chain_follows_the_last_accepted_token(impl, device, accepted):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 4), (TOKENS_B, 6)])
    out_cache_loc = _verify_block(sim, launches, [1, 2])
    assert sim.owner(1) == chain_at(TOKENS_A, 4 + BLOCK)  # the pre launch took the whole block
    _resync(sim, impl, rows=[1, 2], out_cache_loc=out_cache_loc,
            accept_lens=[accepted, BLOCK], dtype=torch.int64)
    assert sim.owner(1) == chain_at(TOKENS_A, 4 + accepted)
    assert sim.owner(2) == chain_at(TOKENS_B, 6 + BLOCK)
    assert sim.violations() == []


def test_out_of_range_accept_lengths_and_unwritten_slots_leave_the_owner_unknown(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 4), (TOKENS_B, 2)])
    out_cache_loc = _verify_block(sim, launches, [1, 2])
    _resync(sim, impl, rows=[1, 2], out_cache_loc=out_cache_loc, accept_lens=[0, BLOCK + 1])
    assert (sim.owner(1), sim.owner(2)) == (0, 0)
    out_cache_loc = _verify_block(sim, launches, [1, 2])
    out_cache_loc[1] = 0  # the slot of row 0's second token: the padding slot
    _resync(sim, impl, rows=[1, 2], out_cache_loc=out_cache_loc, accept_lens=[2, 1])
    assert sim.owner(1) == 0
    assert sim.owner(2) == chain_at(TOKENS_B, 2 + BLOCK + 1)


def test_padding_rows_and_an_empty_launch_change_nothing(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 4)])
    out_cache_loc = _verify_block(sim, launches, [1])
    before = sim.state.owner_chains.clone()
    _resync(sim, impl, rows=[0], out_cache_loc=out_cache_loc, accept_lens=[1])
    empty = torch.zeros(0, dtype=torch.int64, device=sim.device)
    _resync(sim, impl, rows=[], out_cache_loc=empty, accept_lens=[])
    assert torch.equal(sim.state.owner_chains, before)


def test_bad_arguments_are_named(impl, device):
    sim, _ = prefilled(impl, device, prompts=[(TOKENS_A, 2)])
    launch = accepted_owner_impl(impl).launch_accepted_owner_resync
    rows = torch.ones(2, dtype=torch.int64, device=sim.device)
    slots = torch.ones(2 * BLOCK, dtype=torch.int64, device=sim.device)
    with pytest.raises(TypeError, match="accept_lens has dtype torch.float32"):
        launch(state=sim.state, req_pool_indices=rows, out_cache_loc=slots,
               accept_lens=rows.float(), block=BLOCK)
    with pytest.raises(ValueError, match="out_cache_loc has 6 entries but 2 rows of block 4"):
        launch(state=sim.state, req_pool_indices=rows, out_cache_loc=slots, accept_lens=rows,
               block=4)
    with pytest.raises(ValueError, match="accept_lens has 1 entries but req_pool_indices has 2"):
        launch(state=sim.state, req_pool_indices=rows, out_cache_loc=slots,
               accept_lens=rows[:1], block=BLOCK)
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        launch(state=sim.state, req_pool_indices=rows, out_cache_loc=slots, accept_lens=rows,
               block=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
