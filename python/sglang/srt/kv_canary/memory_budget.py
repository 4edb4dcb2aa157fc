"""How much device memory the canary takes, and how it is taken out of the KV budget.

SGLang 0.5.12 sizes the KV pool as ``max_total_num_tokens = available_bytes // cell_size``
(``DefaultPoolConfigurator``). The canary keeps one record per pool slot and a few fixed buffers,
all allocated right after the pool, so it is budgeted in two parts:

* per token: :data:`RECORD_BYTES` is added to the KV cell size (the records scale with the pool);
* fixed: the pool's ``page_size`` padding rows of records, the violation ring and the counters are
  subtracted from the profiled available bytes before the pool is sized.

The pool therefore holds slightly fewer tokens with the canary on, and the total device memory
used by KV + canary stays within ``--mem-fraction-static``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, RECORD_BYTES, RING_ROW_FIELDS

_INT64_BYTES = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryMemory:
    """Device bytes the canary allocates beside one KV pool."""

    num_slots: int  # record rows: the pool's slots plus its page_size padding rows
    ring_capacity: int

    @property
    def record_bytes(self) -> int:
        return self.num_slots * RECORD_BYTES

    @property
    def ring_bytes(self) -> int:
        return self.ring_capacity * RING_ROW_FIELDS * _INT64_BYTES

    @property
    def counter_bytes(self) -> int:
        return NUM_COUNTERS * _INT64_BYTES

    @property
    def total_bytes(self) -> int:
        return self.record_bytes + self.ring_bytes + self.counter_bytes


def fixed_bytes(*, ring_capacity: int, page_size: int) -> int:
    """Bytes that do not scale with the pool's token count (subtracted from the KV budget)."""
    return CanaryMemory(num_slots=page_size, ring_capacity=ring_capacity).total_bytes


def per_token_bytes() -> int:
    """Bytes per pool token (added to the KV cell size)."""
    return RECORD_BYTES
