"""Plain-torch reference of :mod:`.publish_counters` (same keyword signature and contract, stated
in that module's docstring); tests compare the two exactly. Drives the CPU self-check and the CPU
tests, where the host copy that follows it completes at once."""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.consts import CHECKSUM_BASE, COUNTER_CHECKSUM, COUNTER_PUBLISHES
from sglang.jit_kernel.kv_canary.hashing import CHECKSUM_KEYS
from sglang.jit_kernel.kv_canary.kernel_inputs import check_publish_inputs


def launch_publish_counters(*, counters: torch.Tensor) -> None:
    """Reference of :func:`.publish_counters.launch_publish_counters`."""
    check_publish_inputs(counters=counters)
    counters[COUNTER_PUBLISHES] += 1
    keys = torch.tensor(CHECKSUM_KEYS, dtype=torch.int64, device=counters.device)
    counters[COUNTER_CHECKSUM] = (counters[:COUNTER_CHECKSUM] * keys).sum() + CHECKSUM_BASE
