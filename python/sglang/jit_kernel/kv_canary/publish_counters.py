"""Triton kernel that seals the canary counters for publication: one single-program launch after
each forward, captured into the decode graphs, so that the host can read a copy of the counters
in pinned memory without an event, a query or a sync.

Contract (``counters``: int64 ``[NUM_COUNTERS]``, contiguous, the device state's counters; layout
in :mod:`.consts`):

- ``counters[COUNTER_PUBLISHES] += 1``;
- ``counters[COUNTER_CHECKSUM] = hashing.counters_checksum(counters)`` (after the increment):
  ``CHECKSUM_BASE + sum(counters[i] * CHECKSUM_KEYS[i])`` in wrapping int64.

Every other word is left as it is. The caller copies the counters to the host right after this
launch, on the same stream (:mod:`sglang.srt.kv_canary.monitor.counter_mailbox`); a host read
that mixes two such copies fails the checksum.

Graph safety: one program, fixed shapes, nothing allocated, no host sync; no argument is
specialized on its value, so the launch goes through a :class:`.direct_launch.DirectLauncher`.
The plain-torch twin is :mod:`.publish_counters_ref` (same keyword signature, same results).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.consts import (
    CHECKSUM_BASE,
    CHECKSUM_MULTIPLIER,
    COUNTER_CHECKSUM,
    COUNTER_PUBLISHES,
)
from sglang.jit_kernel.kv_canary.direct_launch import DirectLauncher
from sglang.jit_kernel.kv_canary.kernel_inputs import check_publish_inputs
from sglang.jit_kernel.kv_canary.launch_config import interpreted, require_cuda_or_interpreter
from sglang.jit_kernel.kv_canary.triton_helpers import sum_1d

BLOCK = triton.next_power_of_2(COUNTER_CHECKSUM)
NUM_WARPS = 1


@triton.jit
def _publish_counters_kernel(
    counters_ptr,
    PUBLISHES: tl.constexpr,
    CHECKSUM: tl.constexpr,
    MULTIPLIER: tl.constexpr,
    BASE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    index = tl.arange(0, BLOCK)
    summed = index < CHECKSUM
    words = tl.load(counters_ptr + index, mask=summed, other=0)
    words += (index == PUBLISHES).to(tl.int64)
    tl.store(counters_ptr + index, words, mask=index == PUBLISHES)
    keys = ((index + 1).to(tl.int64) * MULTIPLIER) | 1
    checksum = sum_1d(tl.where(summed, words * keys, 0)) + BASE
    tl.store(counters_ptr + CHECKSUM, checksum)


def launch_publish_counters(*, counters: torch.Tensor) -> None:
    """Count a publication and seal the counters (Triton); contract in the module docstring.

    Raises:
        TypeError / ValueError: see :func:`.kernel_inputs.check_publish_inputs`.
    """
    check_publish_inputs(counters=counters)
    require_cuda_or_interpreter(
        device=counters.device, kernel_interpreted=_INTERPRETED,
        who_needs="launch_publish_counters needs",
        reference="publish_counters_ref (same contract)",
    )
    _LAUNCH(
        (1,), counters, COUNTER_PUBLISHES, COUNTER_CHECKSUM, CHECKSUM_MULTIPLIER, CHECKSUM_BASE,
        BLOCK,
    )


_INTERPRETED = interpreted(_publish_counters_kernel)
_LAUNCH = DirectLauncher(_publish_counters_kernel, num_warps=NUM_WARPS)
