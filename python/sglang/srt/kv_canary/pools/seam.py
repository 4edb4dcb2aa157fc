"""The pool seam: what the canary needs to know about one KV pool type, in one place.

Everything the runner, the device state, the sweep, the fault injector and the memory budget
need that depends on how a KV pool lays out its slots is asked of a :class:`CanaryPool`; one
implementation per pool type lives beside this module (:mod:`.mha`), and
:func:`~sglang.srt.kv_canary.pools.canary_pool_for` picks it. The runner and the kernels stay
generic: records are indexed by *record slot*, and the implementation says how a
``req_to_token`` entry or an ``out_cache_loc`` (a KV slot) becomes one.

What an implementation provides:

* **record slots**: how many rows the records tensor has (every slot SGLang may hand out, its
  padding slot 0 included), and the :class:`SlotMapping` from a KV slot to its record slot;
* **real-data sources**: the pool buffers whose bytes a slot's fingerprint folds, one
  :class:`FingerprintBuffer` each (views of SGLang's buffers, row = record slot), and the same
  buffers are the ones the real-data faults flip;
* **sweep enumeration**: which prefix caches the radix sweep can walk over this pool, and the
  record slots of one cached node's KV indices;
* **memory**: the bytes the records add per KV token (added to SGLang's cell size before the
  pool is sized) and the record rows the pool has beyond its token capacity;
* **a description** for the start-up line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import torch


class SlotMapping(enum.Enum):
    """How a KV slot (a ``req_to_token`` entry, an ``out_cache_loc``) names its record slot."""

    # the record slot is the KV slot: one record row per pool slot, same index
    IDENTITY = "identity"


@dataclass(frozen=True, slots=True, kw_only=True)
class FingerprintBuffer:
    """One pool buffer the real-data fingerprint reads: ``buffer[s]`` holds the bytes of record
    slot ``s`` (any trailing shape; each slot's bytes contiguous). ``name`` appears in logs and in
    the real-data faults' lines (e.g. ``layer 0 K``)."""

    name: str
    buffer: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.buffer, torch.Tensor) or self.buffer.dim() < 2:
            raise ValueError(
                f"FingerprintBuffer {self.name!r} must be a tensor of at least 2 dimensions "
                f"[slots, ...], got {getattr(self.buffer, 'shape', type(self.buffer))}"
            )

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's row."""
        return self.buffer[0].numel() * self.buffer.element_size()


class CanaryPool(Protocol):
    """The canary's view of one KV pool (see the module docstring). Built once per model runner,
    when its pools exist; never changes them."""

    @property
    def kind(self) -> str:
        """The pool type in words (its SGLang class name), for logs and refusals."""

    @property
    def num_record_slots(self) -> int:
        """Rows of the records tensor: every slot a ``req_to_token`` entry may name."""

    @property
    def slot_mapping(self) -> SlotMapping:
        """How a KV slot names its record slot."""

    @property
    def device(self) -> torch.device:
        """Where the pool (and so the records) live."""

    def fingerprint_buffers(self) -> tuple[FingerprintBuffer, ...]:
        """The buffers the real-data fingerprint folds, in a fixed order (at most
        ``MAX_REAL_DATA_SOURCES``)."""

    def sweep_refusal(self, tree_cache: object) -> str | None:
        """Why the radix sweep cannot walk ``tree_cache`` over this pool (None when it can)."""

    def cached_record_slots(self, node_value: torch.Tensor) -> torch.Tensor:
        """The record slots (int64, on :attr:`device`) of one prefix-cache node's KV indices."""

    def describe(self) -> str:
        """One phrase for the start-up line (pool type, slots, what real data reads)."""
