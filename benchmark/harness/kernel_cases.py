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
write-input expectations, the host seq_lens mirror) and, with a window, the pool is a hybrid
sliding-window one (SGLang's ``SWAKVPool``, as gpt-oss serves): :func:`window_sub_pool` gives its
SWA sub-pool (window slots mapped from the record slots, their owners, the SWA layer's K and V).
:func:`state_of` and :func:`batch_of` give the launches' arguments; a pre launch then a post
launch of them is a clean forward.

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
    SlotWindow,
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
SWA_WINDOW = 127  # gpt-oss's sliding window, as SGLang's model runner gives it to the canary
# A hybrid pool's sources: full layer-0 K, full last-layer V, then SWA layer-0 K and SWA
# last-layer V, which are indexed by window slot (bits 2 and 3)
WINDOWED_SOURCES = 0b1100
NUM_WINDOWED_SOURCES = WINDOWED_SOURCES.bit_count()
WINDOW_TABLE_BYTES = 8  # the int64 entry of a record slot in the full-to-SWA table
WINDOW_OWNER_BYTES = 8  # the int64 owner of a window slot
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
# real data of the server configurations (no token checks), on an MHA and on a hybrid SWA pool
SWEEP_CHECKS = ("none", "partial", "partial+window")


@dataclass(frozen=True, slots=True, kw_only=True)
class Checks:
    """What the launches check: real-data fingerprints (``none``, ``partial``, ``all``; each
    prefix slot's bytes every ``stride``-th forward), with ``tokens`` the token checks, and with
    ``window`` > 0 the window slots of a hybrid sliding-window pool of that window (real-data
    sources 2 and 3 are then the SWA sub-pool's, see :func:`window_sub_pool`); ``window`` 0: an
    MHA pool, one slot space."""

    name: str
    real_data: str
    stride: int = 1
    tokens: bool = False
    window: int = 0


CHECKS: dict[str, Checks] = {checks.name: checks for checks in (
    Checks(name="none", real_data="none"),
    Checks(name="partial", real_data="partial"),
    Checks(name="all-checks", real_data="partial", tokens=True),
    Checks(name="all", real_data="all"),
    Checks(name="partial+window", real_data="partial", window=SWA_WINDOW),
    Checks(name="all-checks+window", real_data="partial", tokens=True, window=SWA_WINDOW),
)}
# what a run times unless told otherwise: every MHA set and the hybrid pool with "partial" (its
# lines compare one to one with the MHA pool's "partial" lines)
DEFAULT_CHECKS = ("none", "partial", "all-checks", "all", "partial+window")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """A clean history of a scenario's requests and the forward that extends it."""

    scenario: Scenario
    batch: CanaryBatchView
    req_to_token: torch.Tensor
    records: torch.Tensor  # the prefix slots' records, fingerprints of no source
    token_history: torch.Tensor  # int32 [rows + 1, prefix + new]: every row's whole history
    sources: tuple[torch.Tensor, ...]  # row = record slot; a hybrid pool uses the first two
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


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSubPool:
    """The SWA sub-pool of a hybrid pool beside a :class:`Pool`'s record slots, as SGLang leaves
    it before the pool's forward (page size 1: it frees a row's SWA slots below ``P - window -
    1``). Each row's last ``window + 1`` prefix positions (all of a shorter prefix) and its new
    tokens have a window slot; the older prefix positions have none.

    - ``slot_table``: int64 ``[num_slots + 1]``, record slot -> window slot in ``[1, G)``, 0 for
      none, and SGLang's trailing -1 entry;
    - ``owners``: int64 ``[G]``, the record slot of each prefix position's window slot (what the
      post launches stamped), 0 for the new tokens' (never stamped; the post launch stamps them);
    - ``sources``: SWA layer-0 K and last-layer V, int64 ``[G, ROW_WORDS]``, row = window slot.
    """

    window: int
    slot_table: torch.Tensor
    owners: torch.Tensor
    sources: tuple[torch.Tensor, ...]

    @property
    def num_window_slots(self) -> int:
        return self.owners.shape[0]


def window_sub_pool(pool: Pool, *, window: int) -> WindowSubPool:
    """A fresh SWA sub-pool of ``pool`` for a sliding window of ``window`` (>= 0) positions:
    window slots shuffled, or handed out in order with ``pool.scenario.contiguous``; random
    words in its sources."""
    scenario = pool.scenario
    kept = min(scenario.prefix, window + 1)  # prefix positions that still hold a window slot
    with_window_slot = pool.req_to_token[1:, scenario.prefix - kept:].to(torch.int64)
    record_slots = with_window_slot.flatten()
    device = record_slots.device
    count = record_slots.shape[0]
    order = (torch.arange(count, device=device) if scenario.contiguous
             else torch.randperm(count, device=device))
    slot_table = torch.zeros(pool.records.shape[0] + 1, dtype=torch.int64, device=device)
    slot_table[-1] = -1
    slot_table[record_slots] = order + 1
    owners = torch.zeros(count + 1, dtype=torch.int64, device=device)
    cached = with_window_slot[:, :kept].flatten()
    owners[slot_table[cached]] = cached
    sources = tuple(torch.randint(-(1 << 62), 1 << 62, (count + 1, ROW_WORDS), device=device)
                    for _ in range(NUM_WINDOWED_SOURCES))
    return WindowSubPool(window=window, slot_table=slot_table, owners=owners, sources=sources)


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
    counters say the forward's pre launch is next. With ``checks.window`` the state has a fresh
    :func:`window_sub_pool` as its :class:`SlotWindow` (the windowed real-data sources its
    sources, a prefix slot's fingerprint folding their rows at its window slot where it has one,
    as the post launch that stored it read them)."""
    records = pool.records.clone()
    window = window_sub_pool(pool, window=checks.window) if checks.window else None
    real = None
    if checks.real_data != "none":
        sources = pool.sources
        if window is not None:
            sources = pool.sources[:NUM_SOURCES - NUM_WINDOWED_SOURCES] + window.sources
        real = RealDataSources(sources=sources, partial=checks.real_data == "partial",
                               verify_stride=checks.stride)
        for chunk in pool.prefix_slots.split(_FINGERPRINT_CHUNK):
            records[chunk, FIELD_FINGERPRINT] = _prefix_fingerprints(
                slots=chunk, real=real, window=window)
    device = records.device
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=device)
    counters[COUNTER_STEP] = 1
    counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = 1
    slot_window = None
    if window is not None:
        slot_window = SlotWindow(
            slot_table=window.slot_table, owners=window.owners, window=window.window,
            windowed_sources=WINDOWED_SOURCES if real is not None else 0)
    return CanaryDeviceState(
        records=records, req_to_token=pool.req_to_token,
        ring=torch.zeros((RING_CAPACITY, RING_ROW_FIELDS), dtype=torch.int64, device=device),
        counters=counters, owner_chains=pool.owners_before.clone(), real_data=real,
        window=slot_window)


def _prefix_fingerprints(*, slots: torch.Tensor, real: RealDataSources,
                         window: WindowSubPool | None) -> torch.Tensor:
    """The fingerprints of record slots ``slots`` (int64 ``[n]``): with ``window``, its
    sources are read at each slot's window slot, and fold zero words where it has none."""
    if window is None:
        return slot_fingerprints_torch(slots=slots, sources=real.sources, partial=real.partial)
    window_slots = window.slot_table[slots]
    rows = torch.where(window_slots >= 1, window_slots, -1)
    source_rows = [rows if WINDOWED_SOURCES >> source & 1 else None
                   for source in range(len(real.sources))]
    return slot_fingerprints_torch(slots=slots, sources=real.sources, partial=real.partial,
                                   source_rows=source_rows, windowed_sources=WINDOWED_SOURCES)


def prepare_post(state: CanaryDeviceState, pool: Pool) -> None:
    """Make ``state`` what the pool's pre launch and the model leave for the post launch (owner
    chains after the forward, the pre launch counted, no violation so far, and with real data
    the new slots' rows written, as the model writes them over the pre launch's poison: a
    windowed source's at the slot's window slot)."""
    if state.real_data is not None:
        new_slots = pool.batch.out_cache_loc
        for index, source in enumerate(state.real_data.sources):
            rows = new_slots
            if state.window is not None and state.window.windows_source(index):
                rows = state.window.slot_table[new_slots]
            source[rows] = torch.randint(-(1 << 62), 1 << 62, (rows.shape[0], source.shape[1]),
                                         device=source.device)
    state.owner_chains.copy_(pool.owners_after)
    state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = state.counters[COUNTER_STEP] + 1
    state.counters[COUNTER_VIOLATIONS] = 0


def clone_state(state: CanaryDeviceState) -> CanaryDeviceState:
    """A copy of ``state``'s mutable tensors (records, ring, counters, owner chains, window
    owners); the pool's (``req_to_token``, real-data sources, the window table) are shared."""
    window = state.window
    if window is not None:
        window = dataclasses.replace(window, owners=window.owners.clone())
    return CanaryDeviceState(
        records=state.records.clone(), req_to_token=state.req_to_token,
        ring=state.ring.clone(), counters=state.counters.clone(),
        owner_chains=state.owner_chains.clone(), real_data=state.real_data, window=window)


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


def slot_bytes(checks: Checks, *, launch: str, in_window: bool = False) -> int:
    """Bytes a verify reads per slot: its ``req_to_token`` entry, its record (16 bytes of it
    without real data, and in the pre launch, which verifies no real data), the real-data bytes
    (post launch: ``partial`` 16 bytes of one source, ``all`` every source's row; the sweep: 16
    bytes of every source), the token-history entry of the token checks.

    With ``checks.window``: a slot ``in_window`` (its position is one the window needs; in the
    sweep: it has a window slot) also touches its full-to-SWA table entry and its window slot's
    owner (read, or for a new slot written by the post launch): 16 bytes more. A slot outside
    reads no windowed source, so only the non-windowed sources' share of the real-data bytes (2
    of 4 sources), and in the sweep its table entry all the same (8 bytes)."""
    record = 16 if checks.real_data == "none" or launch == "pre" else RECORD_BYTES
    real = 0
    if launch != "pre":
        partial = PARTIAL_BYTES * (NUM_SOURCES if launch == "sweep" else 1)
        real = {"none": 0, "partial": partial, "all": ROW_WORDS * 8 * NUM_SOURCES}[
            checks.real_data] // checks.stride
    history = HISTORY_BYTES if checks.tokens else 0
    window = 0
    if checks.window and in_window:
        window = WINDOW_TABLE_BYTES + WINDOW_OWNER_BYTES
    elif checks.window:
        real = real * (NUM_SOURCES - NUM_WINDOWED_SOURCES) // NUM_SOURCES
        window = WINDOW_TABLE_BYTES if launch == "sweep" else 0
    return REQ_TO_TOKEN_BYTES + record + real + history + window


def window_positions(scenario: Scenario, checks: Checks, *, launch: str) -> int:
    """How many of a row's verified positions ``launch`` treats as in the window (0 without
    ``checks.window``): the pre launch the prefix positions ``p >= P - window``, the post launch
    those and the new ones, the sweep every prefix position with a window slot (the last
    ``window + 1``, :func:`window_sub_pool`)."""
    if not checks.window:
        return 0
    if launch == "sweep":
        return min(scenario.prefix, checks.window + 1)
    in_prefix = min(scenario.prefix, checks.window)
    return in_prefix + (scenario.new if launch == "post" else 0)


def _verify_bytes(scenario: Scenario, checks: Checks, *, launch: str, positions: int) -> int:
    """The :func:`slot_bytes` of every row's first ``positions`` positions."""
    inside = window_positions(scenario, checks, launch=launch)
    return scenario.rows * (inside * slot_bytes(checks, launch=launch, in_window=True)
                            + (positions - inside) * slot_bytes(checks, launch=launch))


def launch_bytes(scenario: Scenario, checks: Checks, *, launch: str) -> int:
    """Bytes the ``pre``, ``post``, ``sweep`` or ``append`` launch of ``scenario`` must touch at
    the least (the append: the sampled-token append after a decode forward):
    the pre launch verifies every prefix slot and writes every new token's record (reading its
    inputs and, with the token checks, its expected input id; with real data, the landing
    poison: 16 bytes per source, and with ``checks.window`` the table entry that names its
    windowed rows); the post launch verifies every slot of the batch; the sweep every prefix
    slot (its entry instead of ``req_to_token``). Verified slots count :func:`slot_bytes`, in
    or out of the window as :func:`window_positions` says."""
    rows, prefix, new = scenario.rows, scenario.prefix, scenario.new
    if launch == "append":  # per row: its index, seq_len, token and known length; two writes
        return rows * (4 * 8 + HISTORY_BYTES + 8)
    if launch == "pre":
        expected = EXPECTED_INPUT_BYTES if checks.tokens else 0
        real_data = checks.real_data != "none"
        poison = LANDING_BYTES * NUM_SOURCES if real_data else 0
        table = WINDOW_TABLE_BYTES if checks.window and real_data else 0
        return (_verify_bytes(scenario, checks, launch="pre", positions=prefix)
                + rows * new * (TOKEN_INPUT_BYTES + RECORD_BYTES + expected + poison + table))
    if launch == "sweep":
        entry = 4 * 8  # slot, previous slot, position, token
        return (_verify_bytes(scenario, checks, launch="sweep", positions=prefix)
                + scenario.verified_slots * (entry - REQ_TO_TOKEN_BYTES))
    return _verify_bytes(scenario, checks, launch="post", positions=prefix + new)
