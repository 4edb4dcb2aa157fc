"""Plain-torch reference of :mod:`.accepted_owner` (same keyword signature, same results; a test
compares them). Loops on the host and synchronizes: tests and CPU self-checks only."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.hashing import to_signed_i64
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    CanaryDeviceState,
    check_accepted_owner_inputs,
)
from sglang.jit_kernel.kv_canary.torch_helpers import read_records


def launch_accepted_owner_resync(
    *,
    state: CanaryDeviceState,
    req_pool_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_lens: torch.Tensor,
    block: int,
) -> None:
    """Reference of the owner-chain resync after a verification (see :mod:`.accepted_owner`)."""
    check_accepted_owner_inputs(
        state=state, req_pool_indices=req_pool_indices, out_cache_loc=out_cache_loc,
        accept_lens=accept_lens, block=block,
    )
    slots = out_cache_loc.tolist()
    for b, (rp, accepted) in enumerate(zip(req_pool_indices.tolist(), accept_lens.tolist())):
        if rp == 0 or not 0 <= rp < state.owner_chains.shape[0]:
            continue
        owner = 0
        if 1 <= accepted <= block:
            slot = slots[b * block + accepted - 1]
            if 1 <= slot < state.num_slots:
                record = read_records(state, torch.tensor([slot], device=state.device))
                owner = to_signed_i64(int(record.successor_chain()[0]))
        state.owner_chains[rp] = owner
