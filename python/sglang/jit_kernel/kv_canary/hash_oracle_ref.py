"""Plain-torch twin of :func:`.hash_oracle.launch_hash_oracle_tokens` (same keyword contract,
identical results): the SplitMix64 finalizer and the unsigned modulo as int64 torch ops."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import check_hash_oracle_inputs
from sglang.jit_kernel.kv_canary.hashing import mix64_torch, unsigned_mod_torch


def hash_oracle_tokens_torch_reference(
    *,
    req_ids: torch.Tensor,
    bootstrap_room_ids: torch.Tensor | None,
    positions: torch.Tensor,
    position_offset: int,
    vocab_size: int,
    tokens_out: torch.Tensor,
    positions_out: torch.Tensor | None = None,
) -> None:
    """Write the oracle's tokens (and positions) of ``n`` rows: see :mod:`.hash_oracle`.
    Elementwise torch ops: no host sync, CUDA-graph capturable."""
    check_hash_oracle_inputs(
        req_ids=req_ids, bootstrap_room_ids=bootstrap_room_ids, positions=positions,
        vocab_size=vocab_size, tokens_out=tokens_out, positions_out=positions_out,
    )
    if tokens_out.shape[0] == 0:
        return
    gid = req_ids
    if bootstrap_room_ids is not None:
        gid = torch.where(bootstrap_room_ids >= 0, bootstrap_room_ids, req_ids)
    position = positions.to(torch.int64) + position_offset
    tokens_out.copy_(unsigned_mod_torch(mix64_torch(gid ^ position), vocab_size))
    if positions_out is not None:
        positions_out.copy_(position)
