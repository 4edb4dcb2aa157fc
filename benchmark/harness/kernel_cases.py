"""Clean canary device states and batches for the kernel benchmark, and the bytes each launch
must touch.

A :class:`Scenario` is a batch shape (decode or extend; rows, cached prefix, new tokens per row).
:func:`build_pool` makes its consistent history: every row's prefix slots hold the records of
its tokens (slots shuffled over the pool, as after a while of serving, or contiguous, as a fresh
server's allocator hands them out), the token history, the owner chains before and after the
forward, and four real-data sources shaped like K and V of a first and a last layer (8 KV heads
x 128 dims of bf16: 2 KiB per slot and source). A :class:`Checks` set says which checks the
launches run: real-data fingerprints (none / partial / all, with a verify stride) and the token
checks of the server's every-check configuration (the token history with verify-token, the
write-input expectations, the host seq_lens mirror). :func:`state_of` and :func:`batch_of` give
the launches' arguments; a pre launch then a post launch of them is a clean forward.

:func:`launch_bytes` is what the launch must read and write at the least; over the device's copy
bandwidth it is the memory-bandwidth bound of the launch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    COUNTER_VIOLATIONS,
    FIELD_CHAIN,
    FIELD_FINGERPRINT,
    FIELD_STAMP,
    FIELD_TOKEN_POSITION,
    NUM_COUNTERS,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
    CheckKind,
    pack_token_position,
)
from sglang.jit_kernel.kv_canary.hashing import (
    chain_before_torch,
    chain_terms_torch,
    slot_fingerprints_torch,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    RealDataSources,
    SweepEntries,
)

KV_HEADS, HEAD_DIM = 8, 128
ROW_WORDS = KV_HEADS * HEAD_DIM * 2 // 8  # int64 words of one source row (2 KiB of bf16)
NUM_SOURCES = 4  # K, V of the first layer; K, V of the last layer
RING_CAPACITY = 1024
REQ_TO_TOKEN_BYTES = 4
RECORD_BYTES = RECORD_FIELDS * 8
TOKEN_INPUT_BYTES = 3 * 8  # input_ids, positions, out_cache_loc of a new token
LANDING_BYTES = 16  # the landing poison of a new slot, per source
HISTORY_BYTES = 4  # the int32 token-history entry verify-token reads per slot
EXPECTED_INPUT_BYTES = 8  # the int64 expected input id of a new token
PARTIAL_BYTES = 16  # real data "partial": 16 bytes of one source per verified slot
_TOKEN_RANGE = 150_000
_FINGERPRINT_CHUNK = 1 << 15


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A batch: ``rows`` requests, each with ``prefix`` cached tokens and ``new`` tokens this
    forward (``contiguous``: each request's slots in one run instead of shuffled)."""

    name: str
    layout: BatchLayout
    rows: int
    prefix: int
    new: int
    contiguous: bool = False

    @property
    def verified_slots(self) -> int:
        return self.rows * self.prefix


SCENARIOS: dict[str, Scenario] = {scenario.name: scenario for scenario in (
    Scenario(name="decode 1 x 1k", layout=BatchLayout.DECODE, rows=1, prefix=1024, new=1),
    Scenario(name="decode 1 x 32k", layout=BatchLayout.DECODE, rows=1, prefix=32768, new=1),
    Scenario(name="decode 64 x 1k", layout=BatchLayout.DECODE, rows=64, prefix=1024, new=1),
    Scenario(name="decode 64 x 8k", layout=BatchLayout.DECODE, rows=64, prefix=8192, new=1),
    Scenario(name="decode 64 x 8k contiguous", layout=BatchLayout.DECODE, rows=64, prefix=8192,
             new=1, contiguous=True),
    Scenario(name="prefill 8k chunk", layout=BatchLayout.EXTEND, rows=1, prefix=0, new=8192),
    Scenario(name="prefill 8k after 8k", layout=BatchLayout.EXTEND, rows=1, prefix=8192,
             new=8192),
    Scenario(name="prefill 64 x 512", layout=BatchLayout.EXTEND, rows=64, prefix=0, new=512),
)}


# the radix sweep's scenario: one history of 1M cached slots (the prefix), no new token
SWEEP = Scenario(name="sweep 1M slots", layout=BatchLayout.EXTEND, rows=1, prefix=1 << 20,
                 new=0)
SWEEP_CHECKS = ("none", "partial")  # real data of the server configurations; no token checks


@dataclass(frozen=True, slots=True, kw_only=True)
class Checks:
    """What the launches check: real-data fingerprints (``none``, ``partial``, ``all``; each
    prefix slot's bytes every ``stride``-th forward) and, with ``tokens``, the token checks."""

    name: str
    real_data: str
    stride: int = 1
    tokens: bool = False


CHECKS: dict[str, Checks] = {checks.name: checks for checks in (
    Checks(name="none", real_data="none"),
    Checks(name="partial", real_data="partial"),
    Checks(name="all-checks", real_data="partial", tokens=True),
    Checks(name="all", real_data="all"),
)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """A clean history of a scenario's requests and the forward that extends it."""

    scenario: Scenario
    batch: CanaryBatchView
    req_to_token: torch.Tensor
    records: torch.Tensor  # the prefix slots' records, fingerprints of no source
    token_history: torch.Tensor  # int32 [rows + 1, prefix + new]: every row's whole history
    sources: tuple[torch.Tensor, ...]
    prefix_slots: torch.Tensor
    owners_before: torch.Tensor  # owner chains of the prefixes
    owners_after: torch.Tensor  # owner chains after the forward


def build_pool(scenario: Scenario, *, device: str) -> Pool:
    """The clean history of ``scenario`` on ``device`` (row 0 is the padding row)."""
    rows, prefix, new = scenario.rows, scenario.prefix, scenario.new
    length = prefix + new
    num_slots = 1 + rows * length
    order = (torch.arange(num_slots - 1, device=device) if scenario.contiguous
             else torch.randperm(num_slots - 1, device=device))
    slots = (order + 1).view(rows, length)
    req_to_token = torch.zeros((rows + 1, length), dtype=torch.int32, device=device)
    req_to_token[1:] = slots.to(torch.int32)
    tokens = torch.randint(0, _TOKEN_RANGE, (rows, length), device=device)
    positions = torch.arange(length, device=device).expand(rows, length)
    chains = chain_before_torch(tokens=tokens, positions=positions)
    terms = chain_terms_torch(tokens=tokens, positions=positions)
    sources = tuple(torch.randint(-(1 << 62), 1 << 62, (num_slots, ROW_WORDS), device=device)
                    for _ in range(NUM_SOURCES))
    records = torch.zeros((num_slots, RECORD_FIELDS), dtype=torch.int64, device=device)
    cached = slots[:, :prefix].flatten()
    records[cached, FIELD_TOKEN_POSITION] = pack_token_position(
        token=tokens[:, :prefix].flatten(), position=positions[:, :prefix].flatten())
    records[cached, FIELD_CHAIN] = chains[:, :prefix].flatten()
    records[cached, FIELD_STAMP] = 1
    after = chains[:, -1] + terms[:, -1]  # the chain value after each whole history
    owners_before = torch.zeros(rows + 1, dtype=torch.int64, device=device)
    owners_before[1:] = chains[:, prefix] if prefix < length else after
    owners_after = torch.zeros_like(owners_before)
    owners_after[1:] = after

    def i64(values: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64, device=device).contiguous()

    extend = scenario.layout is BatchLayout.EXTEND
    batch = CanaryBatchView(
        layout=scenario.layout,
        req_pool_indices=torch.arange(1, rows + 1, device=device),
        seq_lens=i64(torch.full((rows,), length)),
        extend_prefix_lens=i64(torch.full((rows,), prefix)) if extend else None,
        extend_seq_lens=i64(torch.full((rows,), new)) if extend else None,
        extend_start_loc=i64(torch.arange(rows) * new) if extend else None,
        input_ids=i64(tokens[:, prefix:].flatten()),
        positions=i64(positions[:, prefix:].flatten()),
        out_cache_loc=i64(slots[:, prefix:].flatten()),
    )
    token_history = torch.zeros((rows + 1, length), dtype=torch.int32, device=device)
    token_history[1:] = tokens.to(torch.int32)
    return Pool(scenario=scenario, batch=batch, req_to_token=req_to_token, records=records,
                token_history=token_history, sources=sources, prefix_slots=cached,
                owners_before=owners_before, owners_after=owners_after)


def batch_of(pool: Pool, checks: Checks) -> CanaryBatchView:
    """The pool's forward with ``checks``' token checks (none without ``checks.tokens``)."""
    if not checks.tokens:
        return pool.batch
    history_lens = torch.full((pool.token_history.shape[0],), pool.token_history.shape[1],
                              dtype=torch.int64, device=pool.token_history.device)
    return dataclasses.replace(
        pool.batch, token_history=pool.token_history, token_history_lens=history_lens,
        expected_input_ids=pool.batch.input_ids.clone(),
        host_seq_lens=pool.batch.seq_lens.clone(),
    )


def state_of(pool: Pool, checks: Checks) -> CanaryDeviceState:
    """A fresh state of ``pool`` whose prefix records carry ``checks``' fingerprints; its
    counters say the forward's pre launch is next."""
    records = pool.records.clone()
    real = None
    if checks.real_data != "none":
        real = RealDataSources(sources=pool.sources, partial=checks.real_data == "partial",
                               verify_stride=checks.stride)
        for chunk in pool.prefix_slots.split(_FINGERPRINT_CHUNK):
            records[chunk, FIELD_FINGERPRINT] = slot_fingerprints_torch(
                slots=chunk, sources=real.sources, partial=real.partial)
    device = records.device
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=device)
    counters[COUNTER_STEP] = 1
    counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = 1
    return CanaryDeviceState(
        records=records, req_to_token=pool.req_to_token,
        ring=torch.zeros((RING_CAPACITY, RING_ROW_FIELDS), dtype=torch.int64, device=device),
        counters=counters, owner_chains=pool.owners_before.clone(), real_data=real)


def prepare_post(state: CanaryDeviceState, pool: Pool) -> None:
    """Make ``state`` what the pool's pre launch and the model leave for the post launch (owner
    chains after the forward, the pre launch counted, no violation so far, and with real data
    the new slots' rows written, as the model writes them over the pre launch's poison)."""
    if state.real_data is not None:
        new_slots = pool.batch.out_cache_loc
        for source in state.real_data.sources:
            source[new_slots] = torch.randint(-(1 << 62), 1 << 62, (new_slots.shape[0],
                                              source.shape[1]), device=source.device)
    state.owner_chains.copy_(pool.owners_after)
    state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = state.counters[COUNTER_STEP] + 1
    state.counters[COUNTER_VIOLATIONS] = 0


def clone_state(state: CanaryDeviceState) -> CanaryDeviceState:
    """A copy of ``state``'s mutable tensors (records, ring, counters, owner chains)."""
    return CanaryDeviceState(
        records=state.records.clone(), req_to_token=state.req_to_token,
        ring=state.ring.clone(), counters=state.counters.clone(),
        owner_chains=state.owner_chains.clone(), real_data=state.real_data)


def sweep_entries(pool: Pool) -> SweepEntries:
    """Sweep entries of the pool's first row: every prefix slot, chained to the one before."""
    slots = pool.req_to_token[1, :pool.scenario.prefix].to(torch.int64)
    device = slots.device
    prev_slots = torch.cat([torch.full((1,), -1, device=device), slots[:-1]])
    return SweepEntries(slots=slots, prev_slots=prev_slots,
                        positions=torch.arange(slots.shape[0], device=device),
                        tokens=torch.full_like(slots, -1))


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendInputs:
    """The sampled-token append after a decode forward of the pool: every row's next token at
    position ``seq_lens`` into a token history with room for it."""

    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    tokens: torch.Tensor
    pool_out: torch.Tensor
    history_lens_out: torch.Tensor


def append_inputs(pool: Pool) -> AppendInputs:
    """The append inputs of ``pool``'s forward (its batch's ``seq_lens`` are every row's known
    history length, so the first append writes every row)."""
    history = pool.token_history
    rows, length = history.shape
    pool_out = torch.zeros((rows, length + 1), dtype=torch.int32, device=history.device)
    pool_out[:, :length] = history
    lens = torch.full((rows,), length, dtype=torch.int64, device=history.device)
    batch = pool.batch
    return AppendInputs(req_pool_indices=batch.req_pool_indices.to(torch.int64),
                        seq_lens=batch.seq_lens.clone(),
                        tokens=torch.randint_like(batch.seq_lens, _TOKEN_RANGE),
                        pool_out=pool_out, history_lens_out=lens)


def slot_bytes(checks: Checks, *, launch: str) -> int:
    """Bytes a verify reads per prefix slot: its ``req_to_token`` entry, its record (16 bytes of
    it without real data, and in the pre launch, which verifies no real data), the real-data
    bytes (post launch: ``partial`` 16 bytes of one source, ``all`` every source's row; the
    sweep: 16 bytes of every source), the token-history entry of the token checks."""
    record = 16 if checks.real_data == "none" or launch == "pre" else RECORD_BYTES
    real = 0
    if launch != "pre":
        partial = PARTIAL_BYTES * (NUM_SOURCES if launch == "sweep" else 1)
        real = {"none": 0, "partial": partial, "all": ROW_WORDS * 8 * NUM_SOURCES}[
            checks.real_data] // checks.stride
    history = HISTORY_BYTES if checks.tokens else 0
    return REQ_TO_TOKEN_BYTES + record + real + history


def launch_bytes(scenario: Scenario, checks: Checks, *, launch: str) -> int:
    """Bytes the ``pre``, ``post``, ``sweep`` or ``append`` launch of ``scenario`` must touch at
    the least (the append: the sampled-token append after a decode forward):
    the pre launch verifies every prefix slot and writes every new token's record (reading its
    inputs and, with the token checks, its expected input id; with real data, the landing
    poison: 16 bytes per source); the post launch verifies every slot of the batch; the sweep
    every prefix slot (its entry instead of ``req_to_token``)."""
    rows, new = scenario.rows, scenario.new
    if launch == "append":  # per row: its index, seq_len, token and known length; two writes
        return rows * (4 * 8 + HISTORY_BYTES + 8)
    if launch == "pre":
        expected = EXPECTED_INPUT_BYTES if checks.tokens else 0
        poison = LANDING_BYTES * NUM_SOURCES if checks.real_data != "none" else 0
        return (scenario.verified_slots * slot_bytes(checks, launch="pre")
                + rows * new * (TOKEN_INPUT_BYTES + RECORD_BYTES + expected + poison))
    if launch == "sweep":
        entry = 4 * 8  # slot, previous slot, position, token
        return scenario.verified_slots * (entry + slot_bytes(checks, launch="sweep")
                                          - REQ_TO_TOKEN_BYTES)
    return rows * (scenario.prefix + new) * slot_bytes(checks, launch="post")
