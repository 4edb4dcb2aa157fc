"""Test support for the canary kernels (not a test module).

- :func:`canary_impl` returns the launch module of an implementation ("reference" = the torch
  reference, "triton" = the Triton kernels). Without CUDA the Triton kernels run in Triton's
  interpreter: ``TRITON_INTERPRET=1`` is set here before they are imported (and they are
  re-imported if an earlier import compiled them).
- :class:`KvSim` is a paged KV cache with canary state (``req_to_token``, records, ring,
  counters, a real K buffer), an allocator that hands out pages, radix-style prefix sharing,
  and builders of DECODE / EXTEND batch views; :meth:`KvSim.forward` runs one forward: pre
  launch, the "model" writing K rows of the new slots, post launch.
- :func:`expected_history_records` computes records of a history with the scalar hashing only,
  independently of both implementations.
- :func:`state_difference` compares two states exactly (rings as sorted multisets).
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import NamedTuple

import pytest
import torch

from sglang.jit_kernel.kv_canary.batch_view import BatchLayout, CanaryBatchView, CanaryDeviceState
from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_VIOLATIONS,
    NUM_COUNTERS,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
)
from sglang.jit_kernel.kv_canary.hashing import chain_term_scalar, to_signed_i64

CUDA = torch.cuda.is_available()

# Implementations x devices, for pytest.mark.parametrize("impl, device", IMPLS).
IMPLS = [
    pytest.param("reference", "cpu", id="reference-cpu"),
    pytest.param(
        "triton",
        "cpu",
        id="triton-interpreter",
        marks=pytest.mark.skipif(
            CUDA, reason="Triton kernels are compiled for CUDA in this process (no interpreter)"
        ),
    ),
    pytest.param("reference", "cuda", id="reference-cuda", marks=pytest.mark.gpu),
    pytest.param("triton", "cuda", id="triton-cuda", marks=pytest.mark.gpu),
]
# The Triton kernels on whatever this machine runs them on (differential tests).
TRITON_DEVICES = [
    pytest.param(
        "cpu",
        id="interpreter",
        marks=pytest.mark.skipif(CUDA, reason="Triton kernels are compiled for CUDA here"),
    ),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]

_KERNEL_MODULES = (
    "sglang.jit_kernel.kv_canary.triton_hashing",
    "sglang.jit_kernel.kv_canary.canary_kernels",
)


def import_triton_modules() -> tuple[ModuleType, ModuleType]:
    """(triton_hashing, canary_kernels), interpreted when this machine has no CUDA."""
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
        from triton.runtime.interpreter import InterpretedFunction

        kernels = sys.modules.get(_KERNEL_MODULES[1])
        if kernels is not None and not isinstance(
            kernels._pre_forward_verify_kernel, InterpretedFunction
        ):
            for name in _KERNEL_MODULES:
                importlib.reload(sys.modules[name])
    return tuple(importlib.import_module(name) for name in _KERNEL_MODULES)  # type: ignore


def canary_impl(impl: str) -> ModuleType:
    if impl == "reference":
        return importlib.import_module("sglang.jit_kernel.kv_canary.canary_kernels_ref")
    return import_triton_modules()[1]


def reference_module() -> ModuleType:
    return canary_impl("reference")


# ----------------------------------------------------------------------------- oracle


def expected_history_records(tokens: list[int], start: int = 0) -> list[tuple[int, int, int]]:
    """(token, position, chain) of positions ``start..`` of a history, from scalar hashing."""
    records = []
    chain = CHAIN_ANCHOR
    for position, token in enumerate(tokens):
        if position >= start:
            records.append((token, position, chain))
        chain = to_signed_i64(chain + chain_term_scalar(token, position))
    return records


# ----------------------------------------------------------------------------- simulated pool


class Violation(NamedTuple):
    """One ring row, fields in the order of consts.ROW_*."""

    check: int
    reasons: int
    req_pool_index: int
    slot: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain: int
    expected_chain: int
    step: int


@dataclass
class Request:
    req_pool_index: int
    tokens: list[int]  # full known history; position p holds tokens[p]
    slots: list[int] = field(default_factory=list)  # KV slots of positions [0, len(slots))


@dataclass(frozen=True)
class PaddedRow:
    """A padding row (``req_pool_index`` 0) with stale metadata that must be ignored."""

    prefix_len: int = 0
    new_tokens: int = 0  # EXTEND only; a DECODE row always carries one token
    stale_slot: int = 0  # out_cache_loc of its tokens


@dataclass(frozen=True)
class _Entry:
    rp: int
    prefix: int
    ids: list[int]
    positions: list[int]
    slots: list[int]


class KvSim:
    """A paged KV cache with canary state on one device (see module docstring).

    Page 0 is reserved (slot 0 is the padding slot). ``words_per_row`` int64 words of real K
    per slot live in a bf16 buffer ``[num_slots, 2 * heads, words_per_row * 4 / heads]`` whose
    first half of heads is the layer-0 K view the canary fingerprints, so rows are strided.
    """

    def __init__(
        self,
        *,
        device: str,
        page_size: int = 1,
        num_pages: int = 64,
        req_rows: int = 8,
        max_context_len: int = 64,
        words_per_row: int = 4,
        real_kv_num_words: int = 0,
        ring_capacity: int = 256,
        seed: int = 0,
    ) -> None:
        self.device = torch.device(device)
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        self.rng = random.Random(seed)
        generator = torch.Generator().manual_seed(seed)
        heads = 2
        per_head = words_per_row * 4 // heads  # bf16 values per head
        kv_buffer = torch.randn(self.num_slots, 2 * heads, per_head, generator=generator)
        self.kv_buffer = kv_buffer.to(torch.bfloat16).to(self.device)
        real_kv_words = None
        if real_kv_num_words > 0:
            real_kv_words = self.kv_buffer[:, :heads, :].view(self.num_slots, -1)
            real_kv_words = real_kv_words.view(torch.int64)
        req_to_token = torch.zeros(
            (req_rows, max_context_len), dtype=torch.int32, device=self.device
        )
        # Records and ring are views into buffers with guard rows behind them: a kernel reading
        # past the end gets garbage (not zeros), one writing there breaks the guard.
        self._records_buffer = _guarded((self.num_slots, RECORD_FIELDS), self.device)
        self._ring_buffer = _guarded((ring_capacity, RING_ROW_FIELDS), self.device)
        self.state = CanaryDeviceState(
            records=self._records_buffer[: self.num_slots],
            req_to_token=req_to_token,
            ring=self._ring_buffer[:ring_capacity],
            counters=torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=self.device),
            real_kv_words=real_kv_words,
            real_kv_num_words=real_kv_num_words,
        )
        self.free_pages = list(range(1, num_pages))
        self.rng.shuffle(self.free_pages)
        self.requests: dict[int, Request] = {}
        self.model_step = 0

    # -- requests and allocation

    def add_request(self, req_pool_index: int, tokens: list[int]) -> Request:
        request = Request(req_pool_index=req_pool_index, tokens=list(tokens))
        self.requests[req_pool_index] = request
        return request

    def share_prefix(self, *, req_pool_index: int, source: int, num_tokens: int) -> None:
        """Radix hit: reuse ``source``'s first ``num_tokens`` slots (tokens must match)."""
        target, origin = self.requests[req_pool_index], self.requests[source]
        assert target.tokens[:num_tokens] == origin.tokens[:num_tokens]
        assert num_tokens % self.page_size == 0 and not target.slots
        target.slots = origin.slots[:num_tokens]
        self.state.req_to_token[req_pool_index, :num_tokens] = torch.tensor(
            target.slots, dtype=torch.int32
        )

    def allocate(self, request: Request, count: int) -> list[int]:
        """Slots for the request's next ``count`` positions, page by page."""
        slots = []
        for _ in range(count):
            last = request.slots[-1] if request.slots else None
            if last is not None and (last + 1) % self.page_size != 0:
                slot = last + 1
            else:
                slot = self.free_pages.pop() * self.page_size
            request.slots.append(slot)
            slots.append(slot)
        return slots

    # -- batch views

    def extend_batch(
        self,
        rows: Sequence[tuple[int, int] | PaddedRow],
        *,
        padded_rows: int = 0,
        token_pool: bool = False,
        expected_inputs: bool = False,
    ) -> CanaryBatchView:
        """EXTEND batch: ``(req_pool_index, new token count)`` or a padded row per batch row."""
        rows = list(rows) + [PaddedRow()] * padded_rows
        entries = [
            self._padded_entry(row, row.new_tokens)
            if isinstance(row, PaddedRow)
            else self._live_entry(*row)
            for row in rows
        ]
        return self._view(BatchLayout.EXTEND, entries, token_pool, expected_inputs)

    def decode_batch(
        self,
        rows: Sequence[int | PaddedRow],
        *,
        padded_rows: int = 0,
        token_pool: bool = False,
        expected_inputs: bool = False,
    ) -> CanaryBatchView:
        """DECODE batch: one new token per request, or a padded row, per batch row."""
        rows = list(rows) + [PaddedRow()] * padded_rows
        entries = [
            self._padded_entry(row, 1) if isinstance(row, PaddedRow) else self._live_entry(row, 1)
            for row in rows
        ]
        return self._view(BatchLayout.DECODE, entries, token_pool, expected_inputs)

    def _live_entry(self, rp: int, count: int) -> _Entry:
        request = self.requests[rp]
        prefix = len(request.slots)
        slots = self.allocate(request, count)
        if count:
            self.state.req_to_token[rp, prefix : prefix + count] = torch.tensor(
                slots, dtype=torch.int32
            )
        return _Entry(
            rp=rp,
            prefix=prefix,
            ids=request.tokens[prefix : prefix + count],
            positions=list(range(prefix, prefix + count)),
            slots=slots,
        )

    @staticmethod
    def _padded_entry(row: PaddedRow, count: int) -> _Entry:
        return _Entry(
            rp=0,
            prefix=row.prefix_len,
            ids=[0] * count,
            positions=list(range(row.prefix_len, row.prefix_len + count)),
            slots=[row.stale_slot] * count,
        )

    def _view(
        self,
        layout: BatchLayout,
        entries: list[_Entry],
        token_pool: bool,
        expected_inputs: bool,
    ) -> CanaryBatchView:
        def i64(values):
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        def i32(values):
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        ids = [token for entry in entries for token in entry.ids]
        positions = [position for entry in entries for position in entry.positions]
        starts = [0]
        for entry in entries:
            starts.append(starts[-1] + len(entry.ids))
        pool = valid_lens = None
        if token_pool:
            pool = torch.zeros_like(self.state.req_to_token)
            for rp, request in self.requests.items():
                known = request.tokens[: pool.shape[1]]
                pool[rp, : len(known)] = torch.tensor(known, dtype=torch.int32)
            valid_lens = i64(  # indexed by pool row: the history's known length
                [
                    len(self.requests[rp].tokens) if rp in self.requests else 0
                    for rp in range(pool.shape[0])
                ]
            )
        extend = layout is BatchLayout.EXTEND
        return CanaryBatchView(
            layout=layout,
            req_pool_indices=i64([entry.rp for entry in entries]),
            seq_lens=i64([entry.prefix + len(entry.ids) for entry in entries]),
            extend_prefix_lens=i32([entry.prefix for entry in entries]) if extend else None,
            extend_seq_lens=i32([len(entry.ids) for entry in entries]) if extend else None,
            extend_start_loc=i32(starts[:-1]) if extend else None,
            input_ids=i64(ids),
            positions=i64(positions),
            out_cache_loc=i64([slot for entry in entries for slot in entry.slots]),
            expected_input_ids=i64(ids) if expected_inputs else None,
            expected_positions=i64(positions) if expected_inputs else None,
            expected_token_pool=pool,
            expected_token_valid_lens=valid_lens,
        )

    # -- running

    def model_writes_kv(self, batch: CanaryBatchView) -> None:
        """What the model forward does to the real K buffer: new values in the written slots."""
        generator = torch.Generator().manual_seed(1000 + self.model_step)
        self.model_step += 1
        slots = batch.out_cache_loc.to(device="cpu", dtype=torch.int64)
        slots = slots[(slots > 0) & (slots < self.num_slots)]
        values = torch.randn((slots.numel(), *self.kv_buffer.shape[1:]), generator=generator)
        self.kv_buffer[slots.to(self.device)] = values.to(torch.bfloat16).to(self.device)

    def forward(self, impl: ModuleType, batch: CanaryBatchView) -> None:
        impl.launch_pre_forward_verify(state=self.state, batch=batch)
        self.model_writes_kv(batch)
        impl.launch_post_forward_write_and_verify(state=self.state, batch=batch)
        self.assert_guards_intact()

    def assert_guards_intact(self) -> None:
        for name, buffer, rows in (
            ("records", self._records_buffer, self.num_slots),
            ("ring", self._ring_buffer, self.state.ring_capacity),
        ):
            assert bool((buffer[rows:] == GUARD_VALUE).all()), f"a launch wrote past {name}"

    def violations(self) -> list[Violation]:
        """The violation rows kept in the ring, sorted."""
        kept = min(int(self.state.counters[COUNTER_VIOLATIONS]), self.state.ring_capacity)
        return sorted(Violation(*row) for row in self.state.ring[:kept].tolist())

    def counters(self) -> list[int]:
        return self.state.counters.tolist()

    def record(self, slot: int) -> tuple[int, ...]:
        return tuple(self.state.records[slot].tolist())


GUARD_ROWS = 64
GUARD_VALUE = 0x5A5A_5A5A_5A5A_5A5A


def _guarded(shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """Zeros of ``shape`` followed by ``GUARD_ROWS`` rows of ``GUARD_VALUE`` (one buffer)."""
    buffer = torch.full((shape[0] + GUARD_ROWS, shape[1]), GUARD_VALUE, dtype=torch.int64)
    buffer[: shape[0]] = 0
    return buffer.to(device)


def clone_state(state: CanaryDeviceState, *, ring_capacity: int | None = None) -> CanaryDeviceState:
    """A deep copy (the real K words are shared: the launches never write them), optionally
    with an empty ring of another capacity."""
    ring = state.ring.clone()
    if ring_capacity is not None:
        ring = torch.zeros((ring_capacity, ring.shape[1]), dtype=ring.dtype, device=ring.device)
    return CanaryDeviceState(
        records=state.records.clone(),
        req_to_token=state.req_to_token.clone(),
        ring=ring,
        counters=state.counters.clone(),
        real_kv_words=state.real_kv_words,
        real_kv_num_words=state.real_kv_num_words,
    )


def state_difference(expected: CanaryDeviceState, actual: CanaryDeviceState) -> str | None:
    """None if records, counters and the kept ring rows (as multisets) are equal."""
    problems = []
    if not torch.equal(expected.records.cpu(), actual.records.cpu()):
        bad = (expected.records.cpu() != actual.records.cpu()).any(dim=1).nonzero().flatten()
        slot = int(bad[0])
        problems.append(
            f"records differ at {bad.numel()} slots, first slot {slot}: expected "
            f"{expected.records[slot].tolist()}, got {actual.records[slot].tolist()}"
        )
    if not torch.equal(expected.counters.cpu(), actual.counters.cpu()):
        problems.append(
            f"counters differ: expected {expected.counters.tolist()}, "
            f"got {actual.counters.tolist()}"
        )
    else:
        kept = min(int(expected.counters[COUNTER_VIOLATIONS]), expected.ring.shape[0])
        rows_expected = sorted(map(tuple, expected.ring[:kept].tolist()))
        rows_actual = sorted(map(tuple, actual.ring[:kept].tolist()))
        if rows_expected != rows_actual:
            problems.append(f"ring rows differ: expected {rows_expected}, got {rows_actual}")
    return "; ".join(problems) or None

