"""Triton kernel of the owner-chain resync after an EAGLE verification.

A speculative forward (EAGLE target-verify, draft-extend) writes ``block`` tokens per row at
positions ``P .. P + block - 1`` and its pre launch advances the row's owner chain over all of
them. Only the first ``accept_lens[b]`` are kept: the next forward of the row starts at ``P' = P
+ accept_lens[b]``. After the verification has chosen them (on the device), this launch sets
each live row's owner chain to the chain value that follows its last kept token, read from the
record this forward wrote for it. Per row ``b`` (``rp = req_pool_indices[b]``, ``a =
accept_lens[b]``), for ``rp != 0`` inside the owner-chain table:

- ``1 <= a <= block`` and ``slot = out_cache_loc[b * block + a - 1]`` inside ``[1, num_slots)``:
  ``owner_chains[rp] = derived(records[slot])`` (``chain + chain_term(token, position)``);
- otherwise ``owner_chains[rp] = 0`` (unknown: the next pre launch adopts the record's chain).

The record read is the one this forward wrote (``out_cache_loc`` is the forward's own slot
list), never one found through ``req_to_token``, so a redirected ``req_to_token`` entry cannot
feed its foreign chain into the owner chain. The plain-torch twin is :mod:`.accepted_owner_ref`
(same keyword signature, same results). Eager, outside graphs; no host sync; the row count and
the block are not specialized on, so serving never recompiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.direct_launch import DirectLauncher, ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    CanaryDeviceState,
    check_accepted_owner_inputs,
)
from sglang.jit_kernel.kv_canary.triton_helpers import load_record_head, successor_chain

BLOCK = 128


@triton.jit(do_not_specialize=["n", "block"],
            do_not_specialize_on_alignment=["rows_ptr", "out_cache_loc_ptr", "accept_lens_ptr"])
def _accepted_owner_kernel(
    rows_ptr,
    out_cache_loc_ptr,
    accept_lens_ptr,
    n,
    block,
    records_ptr,
    num_slots,
    owner_chains_ptr,
    owner_rows,
    BLOCK: tl.constexpr,
):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = index < n
    rp = tl.load(rows_ptr + index, mask=valid, other=0).to(tl.int64)
    accepted = tl.load(accept_lens_ptr + index, mask=valid, other=0).to(tl.int64)
    live = valid & (rp != 0) & (rp >= 0) & (rp < owner_rows)
    in_block = live & (accepted >= 1) & (accepted <= block)
    slot = tl.load(
        out_cache_loc_ptr + index * block + accepted - 1, mask=in_block, other=0
    ).to(tl.int64)
    known = in_block & (slot >= 1) & (slot < num_slots)
    packed, chain = load_record_head(records_ptr, num_slots, slot, known)
    owner = tl.where(known, successor_chain(packed, chain), 0)
    tl.store(owner_chains_ptr + rp, owner, mask=live)


def launch_accepted_owner_resync(
    *,
    state: CanaryDeviceState,
    req_pool_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_lens: torch.Tensor,
    block: int,
) -> None:
    """Set each live row's owner chain after its kept tokens: see the module docstring.

    Args:
        req_pool_indices: int32 or int64 ``[bs]`` (distinct pool rows; 0 marks padding).
        out_cache_loc: int32 or int64 ``[bs * block]``, the slots the forward wrote, row-major
            blocks.
        accept_lens: int32 or int64 ``[bs]``, tokens kept per row (bonus included).
        block: tokens written per row (``>= 1``).
    Raises:
        TypeError / ValueError: a bad argument, named.
    """
    check_accepted_owner_inputs(
        state=state, req_pool_indices=req_pool_indices, out_cache_loc=out_cache_loc,
        accept_lens=accept_lens, block=block,
    )
    n = req_pool_indices.shape[0]
    if n == 0:
        return
    _LAUNCH(
        (ceil_div(n, BLOCK),),
        req_pool_indices, out_cache_loc, accept_lens, n, block,
        state.records, state.num_slots,
        state.owner_chains, state.owner_chains.shape[0],
        BLOCK=BLOCK,
    )


_LAUNCH = DirectLauncher(_accepted_owner_kernel, num_warps=4)
