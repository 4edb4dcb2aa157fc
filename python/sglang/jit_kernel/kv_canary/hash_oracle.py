"""The token oracle's tokens in one Triton launch (SPEC §4's ``HashOracle``).

Per row ``i`` of a 1-D batch (``n = tokens_out.shape[0]``):

- ``gid = bootstrap_room_ids[i]`` when that is ``>= 0``, else ``req_ids[i]`` (the generalized
  request id, SPEC §3; without ``bootstrap_room_ids``, ``req_ids[i]``);
- ``position = positions[i] + position_offset``;
- ``tokens_out[i] = mix64(u64(gid) ^ u64(position)) mod vocab_size`` (unsigned 64-bit
  semantics), and ``positions_out[i] = position`` when ``positions_out`` is given.

As torch ops that is about twenty-five elementwise kernels per call (the SplitMix64 finalizer
and the unsigned modulo on int64 tensors); the token-oracle sampler and the write-input
expectations of every decode step each paid them. Here it is one launch. The plain-torch twin
is :func:`.hash_oracle_ref.hash_oracle_tokens_torch_reference` (same keyword contract, identical
results; a test compares them).

Contract: ``req_ids`` and ``bootstrap_room_ids`` int64 ``[n]``, ``positions`` int32 or int64
``[n]``, ``tokens_out`` int32 or int64 ``[n]``, ``positions_out`` int64 ``[n]``: 1-D, any
stride, one device; ``vocab_size`` in ``[1, 2**31 - 1]``. Violations raise ``TypeError``
(dtype) or ``ValueError`` (shape, device, vocabulary), naming the argument. ``n == 0`` is a
no-op.

Graph safety: the grid depends on ``n`` only, nothing is allocated and nothing syncs with the
host, so a launch is CUDA-graph capturable; ``n``, the offset and the strides are not
specialized on, nor is the alignment of the tensors, so serving never recompiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.direct_launch import DirectLauncher, ceil_div
from sglang.jit_kernel.kv_canary.kernel_inputs import check_hash_oracle_inputs
from sglang.jit_kernel.kv_canary.triton_helpers import mix64_u64

BLOCK = 256
NUM_WARPS = 4


# Nothing is specialized on its value (callers pass views: a column of a block layout, a prefix
# of a buffer, at any offset), so the variant depends on argument types only and the launches
# go through a DirectLauncher (every decode step's eager path; see direct_launch.py).
@triton.jit(
    do_not_specialize=["req_ids_ptr", "req_ids_stride", "rooms_ptr", "rooms_stride",
                       "positions_ptr", "positions_stride", "tokens_out_ptr", "tokens_stride",
                       "positions_out_ptr", "positions_out_stride", "n", "position_offset",
                       "vocab_size"],
)
def _hash_oracle_tokens_kernel(
    req_ids_ptr,
    req_ids_stride,
    rooms_ptr,
    rooms_stride,
    positions_ptr,
    positions_stride,
    tokens_out_ptr,
    tokens_stride,
    positions_out_ptr,
    positions_out_stride,
    n,
    position_offset,
    vocab_size,
    HAS_ROOMS: tl.constexpr,
    HAS_POSITIONS_OUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = index < n
    gid = tl.load(req_ids_ptr + index * req_ids_stride, mask=valid, other=0)
    if HAS_ROOMS:
        room = tl.load(rooms_ptr + index * rooms_stride, mask=valid, other=-1)
        gid = tl.where(room >= 0, room, gid)
    position = tl.load(positions_ptr + index * positions_stride, mask=valid, other=0)
    position = position.to(tl.int64) + position_offset
    mixed = mix64_u64((gid ^ position).to(tl.uint64, bitcast=True))
    token = mixed % vocab_size.to(tl.uint64)
    out = tokens_out_ptr + index * tokens_stride
    tl.store(out, token.to(out.dtype.element_ty), mask=valid)
    if HAS_POSITIONS_OUT:
        tl.store(positions_out_ptr + index * positions_out_stride, position, mask=valid)


def launch_hash_oracle_tokens(
    *,
    req_ids: torch.Tensor,
    bootstrap_room_ids: torch.Tensor | None,
    positions: torch.Tensor,
    position_offset: int,
    vocab_size: int,
    tokens_out: torch.Tensor,
    positions_out: torch.Tensor | None = None,
) -> None:
    """Write the oracle's tokens (and positions) of ``n`` rows: see the module docstring."""
    check_hash_oracle_inputs(
        req_ids=req_ids, bootstrap_room_ids=bootstrap_room_ids, positions=positions,
        vocab_size=vocab_size, tokens_out=tokens_out, positions_out=positions_out,
    )
    n = tokens_out.shape[0]
    if n == 0:
        return
    rooms = req_ids if bootstrap_room_ids is None else bootstrap_room_ids
    positions_target = tokens_out if positions_out is None else positions_out
    _LAUNCH(
        (ceil_div(n, BLOCK),),
        req_ids, req_ids.stride(0),
        rooms, rooms.stride(0),
        positions, positions.stride(0),
        tokens_out, tokens_out.stride(0),
        positions_target, positions_target.stride(0),
        n, position_offset, vocab_size,
        bootstrap_room_ids is not None,  # HAS_ROOMS
        positions_out is not None,  # HAS_POSITIONS_OUT
        BLOCK,
    )


_LAUNCH = DirectLauncher(_hash_oracle_tokens_kernel, num_warps=NUM_WARPS)
