"""Plain-torch reference of :mod:`.admission_owner` (same keyword signature, same results; a
test compares them). Loops on the host and synchronizes: tests and CPU self-checks only."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_STEP,
    NO_EXPECTED_TOKEN,
    CheckKind,
    Reason,
)
from sglang.jit_kernel.kv_canary.hashing import to_signed_i64
from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState, check_admission_inputs
from sglang.jit_kernel.kv_canary.torch_helpers import append_rows, row_seed


def launch_admission_owner_check(
    *,
    state: CanaryDeviceState,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    chains: torch.Tensor,
) -> None:
    """Reference of the deferred admission check (see :mod:`.admission_owner`)."""
    check_admission_inputs(
        state=state, req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, chains=chains
    )
    step = int(state.counters[COUNTER_STEP])
    violations: list[list[int]] = []
    for rp, prefix, expected in zip(
        req_pool_indices.tolist(), prefix_lens.tolist(), chains.tolist()
    ):
        if rp == 0:
            continue
        seed = row_seed(state, rp, prefix)
        if seed.chain != expected:
            violations.append([int(CheckKind.PRE_VERIFY), int(Reason.VERIFY_OWNER), rp,
                               seed.slot, prefix - 1, seed.token, NO_EXPECTED_TOKEN, seed.chain,
                               expected, step])
        if 0 <= rp < state.owner_chains.shape[0]:
            state.owner_chains[rp] = to_signed_i64(
                int(state.owner_chains[rp]) + expected - seed.chain
            )
    append_rows(state=state, rows=violations)
