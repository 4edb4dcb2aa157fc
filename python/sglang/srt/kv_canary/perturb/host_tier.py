"""The host-tier faults (``--enable-hierarchical-cache``), drawn per load-back SGLang starts.

Both act on the loads queued in ``HiCacheController.load_queue`` right before
``start_loading`` merges and copies them, on the host and without synchronizing:

* ``real_kv_host``: a corrupted host copy. One loaded slot's host row of one fingerprinted
  buffer (the pool seam's host views, :meth:`~..pools.seam.CanaryPool.host_fingerprint_buffers`)
  gets a byte flipped in each of its 16-byte windows, so whichever window ``partial`` folds
  changes (``all`` folds them all). The host pool is pinned host memory and its load copies are
  enqueued after this, so they carry the flip; kept. Reported at the load-back forward as
  ``verify_real_kv_hash`` (the re-key complements the slot's fingerprint).
* ``load_shift``: a load of two pages or more copies page ``i`` (its KV and, following the same
  indices, its records) into the device slots of page ``i - 1`` (the first into the last's):
  the queued operation's device slots rotated by a page. The request reads the slots the radix node
  names, which now hold another page: ``verify_position`` at the load-back forward. Kept.

Each logs one ``kv_canary perturb:`` line (:data:`HOST_FAULT_LINE_RE`) naming the forward step
that reads the load.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from typing import Any

import torch

from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_PREFIX
from sglang.srt.kv_canary.pools.real_data import PARTIAL_BYTES_PER_SOURCE
from sglang.srt.kv_canary.pools.seam import CanaryPool

logger = logging.getLogger(__name__)

REAL_KV_HOST = "real_kv_host"
LOAD_SHIFT = "load_shift"
HOST_FAULT_LINE_RE = re.compile(
    r"kv_canary perturb: fault=(?P<fault>real_kv_host|load_shift) step=(?P<step>\d+) "
    r"loaded_tokens=(?P<tokens>\d+)(?P<detail>(?: [a-z_]+=\S+)*)$"
)
_FLIP_MASK = 0x5A


class HostTierFaults:
    """Seeded draws of the host-tier faults (see the module docstring).

    Args:
        real_kv_host_prob, load_shift_prob: per queued load.
        warmup_steps: no fault before this forward step.
        seed: the generator's seed (the host faults draw from their own generator).
        page_size: the pool's page size (a shift moves a whole page).
        host_buffers: byte views ``[host slots, row bytes]`` of the host pool's fingerprinted
            rows with their names (the pool seam's host views); required for ``real_kv_host``.
        next_step: the step of the next forward (the one that reads a load started now).
    """

    def __init__(self, *, real_kv_host_prob: float, load_shift_prob: float, warmup_steps: int,
                 seed: int, page_size: int,
                 host_buffers: tuple[tuple[str, torch.Tensor], ...],
                 next_step: Callable[[], int]) -> None:
        if real_kv_host_prob > 0 and not host_buffers:
            raise ValueError("real_kv_host needs the host pool's fingerprinted rows")
        self._real_kv_host_prob = real_kv_host_prob
        self._load_shift_prob = load_shift_prob
        self._warmup_steps = warmup_steps
        self._rng = random.Random(seed ^ 0x4057)
        self._page_size = page_size
        self._host_buffers = host_buffers
        self._next_step = next_step

    def before_loading(self, *, load_queue: list[Any], host_pool: Any) -> None:
        """Maybe corrupt the queued loads (``CacheOperation``s with CPU ``host_indices`` and
        device ``device_indices``)."""
        step = self._next_step()
        if step < self._warmup_steps:
            return
        for operation in load_queue:
            count = int(operation.host_indices.shape[0])
            if self._real_kv_host_prob and self._rng.random() < self._real_kv_host_prob:
                self._flip_host_copy(operation, step=step, count=count)
            if self._load_shift_prob and count >= 2 * self._page_size \
                    and self._rng.random() < self._load_shift_prob:
                operation.device_indices = torch.roll(operation.device_indices,
                                                      self._page_size)
                logger.info(f"{PERTURB_LINE_PREFIX} fault={LOAD_SHIFT} step={step} "
                            f"loaded_tokens={count} shift={self._page_size}")

    def _flip_host_copy(self, operation: Any, *, step: int, count: int) -> None:
        index = self._rng.randrange(count)
        host_slot = int(operation.host_indices[index])  # a CPU tensor: no device sync
        name, rows = self._host_buffers[self._rng.randrange(len(self._host_buffers))]
        windows = max(1, rows.shape[1] // PARTIAL_BYTES_PER_SOURCE)
        columns = torch.arange(windows) * PARTIAL_BYTES_PER_SOURCE
        rows[host_slot, columns] ^= _FLIP_MASK
        logger.info(f"{PERTURB_LINE_PREFIX} fault={REAL_KV_HOST} step={step} "
                    f"loaded_tokens={count} token_index={index} host_slot={host_slot} "
                    f"buffer={name.replace(' ', '_')} bytes_flipped={windows}")


def build_host_tier_faults(*, config: PerturbConfig, pool: CanaryPool, host_pool: Any,
                           page_size: int, next_step: Callable[[], int]) -> HostTierFaults | None:
    """The host-tier faults of ``config`` over ``host_pool``, or None when both are off.

    Raises:
        ValueError: ``real_kv_host`` is on but the host pool's layout keeps a slot's row in
            pieces (the pool seam names the layouts it reads).
    """
    if not config.real_kv_host_prob and not config.load_shift_prob:
        return None
    host_buffers: tuple[tuple[str, torch.Tensor], ...] = ()
    if config.real_kv_host_prob:
        host_buffers = tuple(
            (source.name, source.buffer.view(source.buffer.shape[0], -1).view(torch.uint8))
            for source in pool.host_fingerprint_buffers(host_pool)
        )
    return HostTierFaults(
        real_kv_host_prob=config.real_kv_host_prob, load_shift_prob=config.load_shift_prob,
        warmup_steps=config.warmup_steps, seed=config.seed, page_size=page_size,
        host_buffers=host_buffers, next_step=next_step,
    )
