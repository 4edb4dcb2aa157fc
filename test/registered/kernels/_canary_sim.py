"""Test support for the canary launches (not a test module).

- :func:`canary_impl` / :func:`sweep_impl` return the launch module of an implementation
  ("reference" = the torch reference, "triton" = the Triton kernels). Without CUDA the Triton
  kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` is set here before they are
  imported (and they are re-imported if an earlier import compiled them).
- :class:`KvSim` is a paged KV cache with canary state (``req_to_token``, records, ring,
  counters, owner chains, real K/V buffers of a first and a last layer), an allocator handing out
  pages, radix-style prefix sharing, and builders of DECODE / EXTEND batch views;
  :meth:`KvSim.forward` runs one forward: pre launch, the "model" writing K/V of the new slots,
  post launch.
- :func:`history_records` computes (token, position, chain) of a history with the scalar hashing
  only, independently of both implementations.
- :func:`state_difference` compares two states exactly (rings as multisets).
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

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    NUM_COUNTERS,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
    ROW_INDEX,
    unpack_position,
    unpack_token,
)
from sglang.jit_kernel.kv_canary.hashing import (
    chain_after_scalar,
    chain_term_scalar,
    slot_fingerprint_scalar,
    to_signed_i64,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    RealDataSources,
)

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
# Triton's interpreter only, for cases whose CUDA run would compile kernel variants (seconds
# each) to check again what the interpreter checks with the same code.
INTERPRETER_DEVICES = [device for device in TRITON_DEVICES if device.values == ("cpu",)]

_PACKAGE = "sglang.jit_kernel.kv_canary"
# Kernel modules in import order (helpers first): reloaded together under the interpreter.
TRITON_MODULES = (
    f"{_PACKAGE}.triton_helpers",
    f"{_PACKAGE}.canary_forward",
    f"{_PACKAGE}.sweep",
    f"{_PACKAGE}.hash_oracle",
    f"{_PACKAGE}.admission_owner",
    f"{_PACKAGE}.accepted_owner",
    f"{_PACKAGE}.append_history",
    f"{_PACKAGE}.publish_counters",
    f"{_PACKAGE}.rekey_loaded",
)


def import_triton_modules() -> dict[str, ModuleType]:
    """The Triton kernel modules by short name, interpreted when this machine has no CUDA."""
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
        from triton.runtime.interpreter import InterpretedFunction

        helpers = sys.modules.get(TRITON_MODULES[0])
        if helpers is not None and not isinstance(helpers.mix64, InterpretedFunction):
            for name in TRITON_MODULES:
                if name in sys.modules:
                    importlib.reload(sys.modules[name])
    return {name.rsplit(".", 1)[1]: importlib.import_module(name) for name in TRITON_MODULES}


def canary_impl(impl: str) -> ModuleType:
    """Module with ``launch_pre_forward`` / ``launch_post_forward`` of ``impl``."""
    if impl == "reference":
        return importlib.import_module(f"{_PACKAGE}.canary_forward_ref")
    return import_triton_modules()["canary_forward"]


def hash_oracle_launch(impl: str):
    """``launch_hash_oracle_tokens`` of ``impl`` (its torch twin for ``reference``)."""
    if impl == "reference":
        module = importlib.import_module(f"{_PACKAGE}.hash_oracle_ref")
        return module.hash_oracle_tokens_torch_reference
    return import_triton_modules()["hash_oracle"].launch_hash_oracle_tokens


def admission_impl(impl: str) -> ModuleType:
    """Module with ``launch_admission_owner_check`` of ``impl``."""
    if impl == "reference":
        return importlib.import_module(f"{_PACKAGE}.admission_owner_ref")
    return import_triton_modules()["admission_owner"]


def accepted_owner_impl(impl: str) -> ModuleType:
    """Module with ``launch_accepted_owner_resync`` of ``impl``."""
    if impl == "reference":
        return importlib.import_module(f"{_PACKAGE}.accepted_owner_ref")
    return import_triton_modules()["accepted_owner"]


def append_history_impl(impl: str) -> ModuleType:
    """Module with ``launch_append_history_tokens`` of ``impl``."""
    if impl == "reference":
        return importlib.import_module(f"{_PACKAGE}.append_history_ref")
    return import_triton_modules()["append_history"]


def publish_impl(impl: str) -> ModuleType:
    """Module with ``launch_publish_counters`` of ``impl``."""
    if impl == "reference":
        return importlib.import_module(f"{_PACKAGE}.publish_counters_ref")
    return import_triton_modules()["publish_counters"]


def sweep_impl(impl: str) -> ModuleType:
    """Module with ``launch_sweep`` of ``impl``."""
    if impl == "reference":
        return importlib.import_module(f"{_PACKAGE}.sweep_ref")
    return import_triton_modules()["sweep"]


def rekey_impl(impl: str) -> ModuleType:
    """Module with ``launch_rekey_loaded`` of ``impl``."""
    if impl == "reference":
        return importlib.import_module(f"{_PACKAGE}.rekey_loaded_ref")
    return import_triton_modules()["rekey_loaded"]


# ----------------------------------------------------------------------------- oracle


def history_records(tokens: Sequence[int], start: int = 0) -> list[tuple[int, int, int]]:
    """(token, position, chain) of positions ``start..`` of a history, from scalar hashing."""
    records = []
    chain = chain_after_scalar(tokens=[])
    for position, token in enumerate(tokens):
        if position >= start:
            records.append((token, position, chain))
        chain = to_signed_i64(chain + chain_term_scalar(token, position))
    return records


def chain_at(tokens: Sequence[int], position: int) -> int:
    """The chain value of ``position`` in a history (``chain_after`` of the tokens before it)."""
    return chain_after_scalar(tokens=list(tokens[:position]))


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


class Record(NamedTuple):
    """A decoded record."""

    token: int
    position: int
    chain: int
    fingerprint: int
    stamp: int


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


# Words per row of the real-data sources: K and V of the first layer, K and V of the last.
SOURCE_WORDS = (4, 6, 4, 2)
REAL_DATA_MODES = ("none", "partial", "all")


class KvSim:
    """A paged KV cache with canary state on one device (see module docstring).

    Page 0 is reserved (slot 0 is the padding slot). Each real-data source is a view of a bf16
    buffer ``[num_slots, 2 * heads, per_head]`` whose first half of heads is what the canary
    folds, so source rows are strided.
    """

    def __init__(
        self,
        *,
        device: str,
        page_size: int = 1,
        num_pages: int = 64,
        req_rows: int = 8,
        max_context_len: int = 64,
        real_data: str = "none",
        num_sources: int = 2,
        real_data_stride: int = 1,
        ring_capacity: int = 256,
        seed: int = 0,
    ) -> None:
        assert real_data in REAL_DATA_MODES
        self.device = torch.device(device)
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        self.rng = random.Random(seed)
        generator = torch.Generator().manual_seed(seed)
        heads = 2
        self.kv_buffers = []  # the full bf16 buffers the model writes
        sources = []
        for words in SOURCE_WORDS[:num_sources]:
            per_head = words * 4 // heads  # bf16 values per head
            buffer = torch.randn(self.num_slots, 2 * heads, per_head, generator=generator)
            buffer = buffer.to(torch.bfloat16).to(self.device)
            self.kv_buffers.append(buffer)
            sources.append(_strided_words(buffer, heads))
        real = None
        if real_data != "none":
            real = RealDataSources(sources=tuple(sources), partial=real_data == "partial",
                                   verify_stride=real_data_stride)
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
            owner_chains=torch.zeros(req_rows, dtype=torch.int64, device=self.device),
            real_data=real,
        )
        self.sources = sources
        self.free_pages = list(range(1, num_pages))
        self.rng.shuffle(self.free_pages)
        self.requests: dict[int, Request] = {}
        self.model_step = 0

    # -- requests and allocation

    def add_request(self, req_pool_index: int, tokens: list[int]) -> Request:
        """A new request; its owner chain is unknown (0) until its first forward adopts one."""
        request = Request(req_pool_index=req_pool_index, tokens=list(tokens))
        self.requests[req_pool_index] = request
        self.state.owner_chains[req_pool_index] = 0
        return request

    def share_prefix(self, *, req_pool_index: int, source: int, num_tokens: int) -> None:
        """Radix hit: reuse ``source``'s first ``num_tokens`` slots (tokens must match) and set
        the owner chain as the runtime does on admission."""
        target, origin = self.requests[req_pool_index], self.requests[source]
        assert target.tokens[:num_tokens] == origin.tokens[:num_tokens]
        assert num_tokens % self.page_size == 0 and not target.slots
        target.slots = origin.slots[:num_tokens]
        self.state.req_to_token[req_pool_index, :num_tokens] = torch.tensor(
            target.slots, dtype=torch.int32
        )
        self.state.owner_chains[req_pool_index] = chain_at(target.tokens, num_tokens)

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
        token_history: bool = False,
        expected_inputs: bool = False,
        host_seq_lens: bool = False,
    ) -> CanaryBatchView:
        """EXTEND batch: ``(req_pool_index, new token count)`` or a padded row per batch row."""
        rows = list(rows) + [PaddedRow()] * padded_rows
        entries = [
            self._padded_entry(row, row.new_tokens)
            if isinstance(row, PaddedRow)
            else self._live_entry(*row)
            for row in rows
        ]
        return self._view(BatchLayout.EXTEND, entries, token_history, expected_inputs,
                          host_seq_lens)

    def decode_batch(
        self,
        rows: Sequence[int | PaddedRow],
        *,
        padded_rows: int = 0,
        token_history: bool = False,
        expected_inputs: bool = False,
        host_seq_lens: bool = False,
    ) -> CanaryBatchView:
        """DECODE batch: one new token per request, or a padded row, per batch row."""
        rows = list(rows) + [PaddedRow()] * padded_rows
        entries = [
            self._padded_entry(row, 1) if isinstance(row, PaddedRow) else self._live_entry(row, 1)
            for row in rows
        ]
        return self._view(BatchLayout.DECODE, entries, token_history, expected_inputs,
                          host_seq_lens)

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
        token_history: bool,
        expected_inputs: bool,
        host_seq_lens: bool,
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
        history = history_lens = None
        if token_history:
            history = torch.zeros_like(self.state.req_to_token)
            for rp, request in self.requests.items():
                known = request.tokens[: history.shape[1]]
                history[rp, : len(known)] = torch.tensor(known, dtype=torch.int32)
            history_lens = i64(  # indexed by pool row: the history's known length
                [
                    len(self.requests[rp].tokens) if rp in self.requests else 0
                    for rp in range(history.shape[0])
                ]
            )
        extend = layout is BatchLayout.EXTEND
        seq_lens = [entry.prefix + len(entry.ids) for entry in entries]
        return CanaryBatchView(
            layout=layout,
            req_pool_indices=i64([entry.rp for entry in entries]),
            seq_lens=i64(seq_lens),
            extend_prefix_lens=i32([entry.prefix for entry in entries]) if extend else None,
            extend_seq_lens=i32([len(entry.ids) for entry in entries]) if extend else None,
            extend_start_loc=i32(starts[:-1]) if extend else None,
            input_ids=i64(ids),
            positions=i64(positions),
            out_cache_loc=i64([slot for entry in entries for slot in entry.slots]),
            expected_input_ids=i64(ids) if expected_inputs else None,
            expected_positions=i64(positions) if expected_inputs else None,
            token_history=history,
            token_history_lens=history_lens,
            host_seq_lens=i64(seq_lens) if host_seq_lens else None,
        )

    # -- running

    def model_writes_kv(self, batch: CanaryBatchView) -> None:
        """What the model forward does to the real K/V buffers: new values in the written
        slots of every layer."""
        generator = torch.Generator().manual_seed(1000 + self.model_step)
        self.model_step += 1
        slots = batch.out_cache_loc.to(device="cpu", dtype=torch.int64)
        slots = slots[(slots > 0) & (slots < self.num_slots)]
        for buffer in self.kv_buffers:
            values = torch.randn((slots.numel(), *buffer.shape[1:]), generator=generator)
            buffer[slots.to(self.device)] = values.to(torch.bfloat16).to(self.device)

    def forward(self, impl: ModuleType, batch: CanaryBatchView) -> None:
        impl.launch_pre_forward(state=self.state, batch=batch)
        self.model_writes_kv(batch)
        impl.launch_post_forward(state=self.state, batch=batch)
        self.assert_guards_intact()

    def assert_guards_intact(self) -> None:
        for name, buffer, rows in (
            ("records", self._records_buffer, self.num_slots),
            ("ring", self._ring_buffer, self.state.ring_capacity),
        ):
            assert bool((buffer[rows:] == GUARD_VALUE).all()), f"a launch wrote past {name}"

    # -- reading

    def violations(self) -> list[Violation]:
        """The violation rows held in the ring (unconsumed, not dropped), sorted."""
        produced = int(self.state.counters[COUNTER_VIOLATIONS])
        consumed = int(self.state.counters[COUNTER_CONSUMED])
        capacity = self.state.ring_capacity
        held = range(consumed, min(produced, consumed + capacity))
        ring = self.state.ring.tolist()
        for index in held:
            assert ring[index % capacity][ROW_INDEX] == index, "a ring row lacks its index"
        return sorted(Violation(*ring[index % capacity][:ROW_INDEX]) for index in held)

    def consume(self) -> None:
        """Mark every violation produced so far as handled (as the host does)."""
        self.state.counters[COUNTER_CONSUMED] = self.state.counters[COUNTER_VIOLATIONS]

    def counters(self) -> list[int]:
        return self.state.counters.tolist()

    def record(self, slot: int) -> Record:
        packed, chain, fingerprint, stamp = self.state.records[slot].tolist()
        return Record(unpack_token(packed), unpack_position(packed), chain, fingerprint, stamp)

    def owner(self, rp: int) -> int:
        return int(self.state.owner_chains[rp])

    def fingerprint(self, slot: int) -> int:
        """The fingerprint of the slot's live bytes, from the scalar hashing."""
        real = self.state.real_data
        assert real is not None
        rows = [source.cpu().tolist() for source in real.sources]
        return to_signed_i64(slot_fingerprint_scalar(slot=slot, sources=rows, partial=real.partial))


def _strided_words(buffer: torch.Tensor, heads: int) -> torch.Tensor:
    """The first ``heads`` heads of each row of a ``[rows, 2 * heads, per_head]`` bf16 buffer as
    int64 words ``[rows, heads * per_head / 4]``: a view with strided rows."""
    rows, _, per_head = buffer.shape
    words_per_head = per_head // 4
    return buffer.view(torch.int64).as_strided(
        (rows, heads * words_per_head), (2 * heads * words_per_head, 1)
    )


GUARD_ROWS = 64
GUARD_VALUE = 0x5A5A_5A5A_5A5A_5A5A


def _guarded(shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """Zeros of ``shape`` followed by ``GUARD_ROWS`` rows of ``GUARD_VALUE`` (one buffer)."""
    buffer = torch.full((shape[0] + GUARD_ROWS, shape[1]), GUARD_VALUE, dtype=torch.int64)
    buffer[: shape[0]] = 0
    return buffer.to(device)


def clone_state(state: CanaryDeviceState, *, ring_capacity: int | None = None) -> CanaryDeviceState:
    """A deep copy (the real-data sources are shared: the launches never write them),
    optionally with an empty ring of another capacity."""
    ring = state.ring.clone()
    if ring_capacity is not None:
        ring = torch.zeros((ring_capacity, ring.shape[1]), dtype=ring.dtype, device=ring.device)
    return CanaryDeviceState(
        records=state.records.clone(),
        req_to_token=state.req_to_token.clone(),
        ring=ring,
        counters=state.counters.clone(),
        owner_chains=state.owner_chains.clone(),
        real_data=state.real_data,
    )


def _ring_rows(state: CanaryDeviceState) -> list[tuple[int, ...]]:
    """The ring's written rows without their violation index, sorted (a violation row is never
    all zeros: reasons != 0). The index says in which order lanes reserved rows, which differs
    between the kernels and the reference; :func:`ring_indices_are_exact` checks it."""
    ring = state.ring.cpu()
    written = ring[ring.ne(0).any(dim=1)]
    return sorted(map(tuple, written[:, :ROW_INDEX].tolist()))


def ring_indices_are_exact(state: CanaryDeviceState) -> bool:
    """Every stored row sits at ``ring[n % capacity]`` with ``n`` in its index field, and the
    stored indices are exactly the unconsumed, undropped ones."""
    produced = int(state.counters[COUNTER_VIOLATIONS])
    consumed = int(state.counters[COUNTER_CONSUMED])
    capacity = state.ring_capacity
    ring = state.ring.cpu().tolist()
    return all(ring[n % capacity][ROW_INDEX] == n
               for n in range(consumed, min(produced, consumed + capacity)))


def state_difference(expected: CanaryDeviceState, actual: CanaryDeviceState) -> str | None:
    """None if records, counters, owner chains and the ring rows (as multisets) are equal.

    Ring rows compare as multisets, which is exact whenever no row was dropped (rows take
    their ring index in launch order, which differs between implementations).
    """
    problems = []
    if not torch.equal(expected.records.cpu(), actual.records.cpu()):
        bad = (expected.records.cpu() != actual.records.cpu()).any(dim=1).nonzero().flatten()
        slot = int(bad[0])
        problems.append(
            f"records differ at {bad.numel()} slots, first slot {slot}: expected "
            f"{expected.records[slot].tolist()}, got {actual.records[slot].tolist()}"
        )
    if not torch.equal(expected.owner_chains.cpu(), actual.owner_chains.cpu()):
        problems.append(
            f"owner chains differ: expected {expected.owner_chains.tolist()}, "
            f"got {actual.owner_chains.tolist()}"
        )
    if not torch.equal(expected.counters.cpu(), actual.counters.cpu()):
        problems.append(
            f"counters differ: expected {expected.counters.tolist()}, "
            f"got {actual.counters.tolist()}"
        )
    rows_expected = _ring_rows(expected)
    rows_actual = _ring_rows(actual)
    if rows_expected != rows_actual:
        extra = sorted(set(rows_actual) - set(rows_expected))[:4]
        missing = sorted(set(rows_expected) - set(rows_actual))[:4]
        problems.append(f"ring rows differ: missing {missing}, unexpected {extra}")
    for name, state in (("reference", expected), ("kernel", actual)):
        if not ring_indices_are_exact(state):
            problems.append(f"the {name}'s ring rows do not carry their violation indices")
    return "; ".join(problems) or None


# ----------------------------------------------------------------------------- hand-test helpers


def expected_counters(
    *,
    pre: int = 0,
    post: int | None = None,
    step: int | None = None,
    verified_pre: int = 0,
    verified_post: int = 0,
    written: int = 0,
    violations: int = 0,
    consumed: int = 0,
    sweeps: int = 0,
    swept: int = 0,
) -> list[int]:
    """The counters vector; ``post`` and ``step`` default to ``pre`` (whole forwards)."""
    from sglang.jit_kernel.kv_canary.consts import (
        COUNTER_ENTRIES,
        COUNTER_KERNEL_RUNS,
        COUNTER_STEP,
        CheckKind,
    )

    post = pre if post is None else post
    counters = [0] * NUM_COUNTERS
    counters[COUNTER_VIOLATIONS] = violations
    counters[COUNTER_STEP] = post if step is None else step
    counters[COUNTER_CONSUMED] = consumed
    counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = pre
    counters[COUNTER_KERNEL_RUNS + CheckKind.WRITE] = pre
    counters[COUNTER_KERNEL_RUNS + CheckKind.POST_VERIFY] = post
    counters[COUNTER_KERNEL_RUNS + CheckKind.SWEEP] = sweeps
    counters[COUNTER_ENTRIES + CheckKind.PRE_VERIFY] = verified_pre
    counters[COUNTER_ENTRIES + CheckKind.POST_VERIFY] = verified_post
    counters[COUNTER_ENTRIES + CheckKind.WRITE] = written
    counters[COUNTER_ENTRIES + CheckKind.SWEEP] = swept
    return counters


def prefilled(impl: str, device: str, *, prompts, **sim_options) -> tuple[KvSim, ModuleType]:
    """A sim whose requests ``1..`` hold ``prompts[i][0][:prompts[i][1]]`` after one EXTEND
    forward (step 0), and the launch module of ``impl``."""
    sim = KvSim(device=device, **sim_options)
    launches = canary_impl(impl)
    rows = []
    for index, (tokens, prefill) in enumerate(prompts, start=1):
        sim.add_request(index, tokens)
        rows.append((index, prefill))
    sim.forward(launches, sim.extend_batch(rows))
    return sim, launches


def assert_history_records(sim: KvSim, rp: int, *, fingerprints: bool = False) -> None:
    """The records of request ``rp``'s slots hold its history (and the live bytes'
    fingerprints, or 0), and its owner chain follows its last slot."""
    request = sim.requests[rp]
    for (token, position, chain), slot in zip(
        history_records(request.tokens[: len(request.slots)]), request.slots
    ):
        record = sim.record(slot)
        assert record[:3] == (token, position, chain), f"slot {slot} (position {position})"
        assert record.stamp > 0
        expected_fingerprint = sim.fingerprint(slot) if fingerprints else 0
        assert record.fingerprint == expected_fingerprint, f"fingerprint of slot {slot}"
    assert sim.owner(rp) == chain_at(request.tokens, len(request.slots))
