"""Triton kernel of the deferred admission check: the pre launch's ownership check of a row
whose owner chain the host sends only after the model forward is enqueued.

A request admitted with a long cached prefix needs its owner chain, ``chain(P)`` of its own
tokens ``[0, P)``, and reading those tokens on the host is O(P). The runner therefore sends the
row to the pre launch with owner chain 0 (unknown: the pre launch adopts the record's chain and
advances it by the row's new tokens) and runs this launch between the model forward and the
post launch, with the host's ``chain(P)``. Per entry ``i`` (``rp = req_pool_indices[i]``, ``P =
prefix_lens[i]``, ``c = chains[i]``), for ``rp != 0``:

- ``seed = CHAIN_ANCHOR`` if ``P == 0``, else ``derived(record(req_to_token[rp, P - 1]))``
  (what the pre launch seeded the row's new tokens with);
- ``seed != c``: a ``PRE_VERIFY`` row ``VERIFY_OWNER`` with slot ``req_to_token[rp, P - 1]`` (0
  if ``P == 0``), position ``P - 1``, stored token that record's (-1 if ``P == 0``), expected
  token -1, stored chain ``seed``, expected chain ``c``, step ``counters[COUNTER_STEP]``: the
  row the pre launch would have written had it known ``c``;
- ``owner_chains[rp] += c - seed`` (int64, wrapping): the value the pre launch would have left,
  ``c + sum(chain_term)`` of the row's new tokens, which the post launch then checks.

The plain-torch twin is :mod:`.admission_owner_ref` (same keyword signature, same results).
Eager only; the entry count and the inputs' alignment are not specialized on (they are views
into the packed upload), so a new batch never compiles a new kernel; no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.consts import COUNTER_STEP, CheckKind, Reason
from sglang.jit_kernel.kv_canary.direct_launch import DirectLauncher, ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState, check_admission_inputs
from sglang.jit_kernel.kv_canary.triton_helpers import (
    CHAIN_ANCHOR_C,
    NO_TOKEN_C,
    load_record_head,
    load_req_to_token,
    ring_append,
    successor_chain,
    unpack_token,
)

BLOCK = 128
_PRE = tl.constexpr(int(CheckKind.PRE_VERIFY))
_VERIFY_OWNER = tl.constexpr(int(Reason.VERIFY_OWNER))
_COUNTER_STEP = tl.constexpr(COUNTER_STEP)


# The inputs are views into one packed upload at offsets that change with the batch: no
# specialization on their alignment (nor on the entry count), so serving never recompiles.
@triton.jit(do_not_specialize=["n"],
            do_not_specialize_on_alignment=["rows_ptr", "prefix_lens_ptr", "chains_ptr"])
def _admission_owner_kernel(
    rows_ptr,
    prefix_lens_ptr,
    chains_ptr,
    n,
    records_ptr,
    num_slots,
    req_to_token_ptr,
    rt_rows,
    rt_cols,
    rt_stride,
    owner_chains_ptr,
    ring_ptr,
    ring_capacity,
    counters_ptr,
    BLOCK: tl.constexpr,
):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = index < n
    rp = tl.load(rows_ptr + index, mask=valid, other=0)
    prefix = tl.load(prefix_lens_ptr + index, mask=valid, other=0)
    expected = tl.load(chains_ptr + index, mask=valid, other=0)
    step = tl.load(counters_ptr + _COUNTER_STEP)
    live = valid & (rp != 0)
    has_prefix = live & (prefix != 0)
    seed_slot = load_req_to_token(
        req_to_token_ptr, rt_rows, rt_cols, rt_stride, rp, prefix - 1, has_prefix
    )
    packed, chain = load_record_head(records_ptr, num_slots, seed_slot, has_prefix)
    seed = tl.where(has_prefix, successor_chain(packed, chain), CHAIN_ANCHOR_C)
    ring_append(
        ring_ptr, counters_ptr, ring_capacity, live & (seed != expected), _PRE, _VERIFY_OWNER,
        rp, seed_slot, prefix - 1, tl.where(has_prefix, unpack_token(packed), NO_TOKEN_C),
        NO_TOKEN_C, seed, expected, step,
    )
    in_pool = live & (rp >= 0) & (rp < rt_rows)
    owner = tl.load(owner_chains_ptr + rp, mask=in_pool, other=0)
    tl.store(owner_chains_ptr + rp, owner + (expected - seed), mask=in_pool)


def launch_admission_owner_check(
    *,
    state: CanaryDeviceState,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    chains: torch.Tensor,
) -> None:
    """Check and settle the owner chains of deferred admissions: see the module docstring.

    Args:
        req_pool_indices / prefix_lens / chains: int64 ``[n]``, contiguous, on the state's
            device (distinct pool rows).
    Raises:
        TypeError / ValueError: a bad argument, named.
    """
    check_admission_inputs(
        state=state, req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, chains=chains
    )
    n = req_pool_indices.shape[0]
    if n == 0:
        return
    table = state.req_to_token
    _LAUNCH(
        (ceil_div(n, BLOCK),),
        req_pool_indices, prefix_lens, chains, n,
        state.records, state.num_slots,
        table, table.shape[0], table.shape[1], table.stride(0),
        state.owner_chains, state.ring, state.ring_capacity, state.counters,
        BLOCK=BLOCK,
    )


_LAUNCH = DirectLauncher(_admission_owner_kernel, num_warps=4)
