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
  :class:`FingerprintBuffer` each (views of SGLang's buffers, row = record slot, or window slot
  for a windowed buffer), and the same buffers are the ones the real-data faults flip;
* **window slots** (a hybrid pool): the :class:`WindowSpec` of a second sub-pool whose slots a
  table maps from the record slots and which a row needs only over its attention window;
* **sweep enumeration**: which prefix caches the radix sweep can walk over this pool, and the
  record slots of one cached node's KV indices;
* **host tier** (the hierarchical cache): whether a host KV pool's slots can carry the records,
  and the host pool's views of the fingerprinted bytes;
* **memory**: the bytes the records add per KV token (added to SGLang's cell size before the
  pool is sized) and the record rows the pool has beyond its token capacity;
* **a description** for the start-up line.

An implementation is built from the pool and a :class:`PoolContext` (what the model runner knows
beside the pool); it refuses, with the reason, what it does not cover.
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
    slot ``s`` (any trailing shape; each slot's bytes contiguous), or with ``windowed`` of window
    slot ``s`` (:class:`WindowSpec`). ``name`` appears in logs and in the real-data faults' lines
    (e.g. ``layer 0 K``)."""

    name: str
    buffer: torch.Tensor
    windowed: bool = False

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


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSpec:
    """The window slots of a hybrid pool: ``slot_table`` (int64, SGLang's own mapping, not a
    copy) maps a record slot to its window slot (a value outside ``[1, num_window_slots)``: none);
    a row with prefix length ``P`` needs window slots at positions ``p >= P - window``."""

    slot_table: torch.Tensor
    num_window_slots: int
    window: int

    def __post_init__(self) -> None:
        table = self.slot_table
        if not isinstance(table, torch.Tensor) or table.dtype != torch.int64 or table.dim() != 1:
            raise ValueError(
                f"WindowSpec.slot_table must be a 1-D int64 tensor, got "
                f"{getattr(table, 'dtype', type(table))} {tuple(getattr(table, 'shape', ()))}"
            )
        if self.num_window_slots < 2:
            raise ValueError(
                f"WindowSpec.num_window_slots must be >= 2, got {self.num_window_slots}"
            )
        if self.window < 0:
            raise ValueError(f"WindowSpec.window must be >= 0, got {self.window}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolContext:
    """What an implementation may need to know beside the pool itself: the model runner's
    ``sliding_window_size`` (None without sliding-window layers) and the attention backends that
    read the pool (prefill, decode: SGLang's names, e.g. ``triton``; empty when unknown, as on a
    CPU)."""

    sliding_window_size: int | None = None
    attention_backends: tuple[str, ...] = ()


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

    def window_spec(self) -> WindowSpec | None:
        """The pool's window slots, or None (one slot space)."""

    def sweep_refusal(self, tree_cache: object) -> str | None:
        """Why the radix sweep cannot walk ``tree_cache`` over this pool (None when it can)."""

    def cached_record_slots(self, node_value: torch.Tensor) -> torch.Tensor:
        """The record slots (int64, on :attr:`device`) of one prefix-cache node's KV indices."""

    def unlocked_leaves(self, tree_cache: object) -> list:
        """The prefix cache's leaves no request holds (KV no live request reads), by node id;
        for the unused-cache fault."""

    def host_tier_refusal(self, host_pool: object) -> str | None:
        """Why the hierarchical cache's host pool ``host_pool`` (its pages copied to and from
        this pool by slot index) cannot carry this pool's records; None when it can."""

    def host_fingerprint_buffers(self, host_pool: object) -> tuple[FingerprintBuffer, ...]:
        """The host pool's views of the bytes :meth:`fingerprint_buffers` reads, in the same
        order, row = host slot (for the host-tier faults).

        Raises:
            ValueError: the host pool's layout keeps a slot's row in pieces.
        """

    def describe(self) -> str:
        """One phrase for the start-up line (pool type, slots, what real data reads)."""
