"""Randomized differential tests: the Triton forward launches vs the torch reference, with
shrinking.

A case is a small, fully explicit :class:`CaseSpec` (rows with prefix lengths and new tokens,
radix sharing, layout, page size, real data, token checks, owner chains, ring offset, and a list
of faults). It is realized deterministically into a simulated KV cache and one forward (pre
launch, the model writing K/V, post launch). The kernels must leave records, owner chains,
counters and the ring (as a multiset) exactly as the reference does after each launch. A failing
case is shrunk delta-debugging style (drop faults and rows, shorten prefixes and chunks, switch
options off) before it is reported, so the report is a minimal reproducer.

Faults are limited to those whose outcome is defined on a GPU: none makes the pre launch write a
slot it also reads (that order is undefined; the hand tests cover those cases through the post
launch). Each case runs with the production tile sizes and with tiny ones, which turns small
cases into many row blocks, many tiles per row and many items per program.
"""

import dataclasses
import random
import sys
from dataclasses import dataclass

import pytest
import torch

from _canary_sim import (
    INTERPRETER_DEVICES,
    TRITON_DEVICES,
    KvSim,
    PaddedRow,
    canary_impl,
    chain_at,
    clone_state,
    history_records,
    import_triton_modules,
    state_difference,
)
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    COUNTER_VIOLATIONS,
    FIELD_CHAIN,
    FIELD_FINGERPRINT,
    FIELD_STAMP,
    FIELD_TOKEN_POSITION,
    NO_EXPECTED_TOKEN,
    CheckKind,
    pack_token_position,
)
from sglang.jit_kernel.kv_canary.hashing import slot_fingerprints_torch
from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=60, suite="kv-canary-cpu")
register_cuda_ci(est_time=180, suite="kv-canary-gpu")

MAX_ROWS = 6
MAX_CONTEXT_LEN = 2048
POOL_SLOTS = 32768
STEP = 5  # forwards before the case's forward: existing records carry stamps 1..STEP
FAULT_KINDS = (
    "rt_other_slot",
    "rt_zero",
    "rt_out_of_range",
    "rt_new_other_slot",
    "rt_new_zero",
    "record_token",
    "record_position",
    "record_chain",
    "record_fingerprint",
    "record_stamp",
    "real_kv",
    "input_id",
    "position",
    "expected_input_id",
    "expected_position",
    "expected_input_id_unknown",
    "expected_position_unknown",
    "position_and_expectation",
    "history_token",
    "history_len",
    "out_cache_loc_zero",
    "out_cache_loc_out_of_range",
    "prefix_shorter",
    "owner_foreign",
    "owner_unknown",
    "host_seq_lens",
    "seq_lens_drift_overwrite",
    "req_pool_index_out_of_range",
    "start_loc_out_of_range",
    "seq_len_negative",
)


@dataclass(frozen=True)
class RowSpec:
    prefix_len: int
    new_tokens: int
    padded: bool = False
    shares_with: int | None = None  # an earlier row whose history this row's prefix shares


@dataclass(frozen=True)
class Fault:
    kind: str
    row: int
    where: float  # in [0, 1): picks the position or token within the row
    value: int


@dataclass(frozen=True)
class CaseSpec:
    seed: int
    layout: BatchLayout
    page_size: int
    real_data: str  # "none", "partial", "all"
    num_sources: int
    token_history: bool
    expected_inputs: bool
    rows: tuple[RowSpec, ...]
    faults: tuple[Fault, ...]
    verify_token: bool = True  # with the history: verify tokens, or only write fallbacks
    predicted: bool = True  # expected input ids given (else all NO_EXPECTED_TOKEN, as prompts)
    host_seq_lens: bool = False
    owners_known: bool = True  # owner chains set on admission (else adopted: 0)
    real_data_stride: int = 1  # prefix bytes checked where (position + step) % stride == 0
    ring_offset: int = 0  # violation indices already produced and consumed (ring wrap)


# ----------------------------------------------------------------------------- generation


# Option sets a GPU run draws from (each set compiles its own kernel variants; drawing every
# option independently would compile hundreds): real data, sources, token history, verify
# token, expected inputs, host seq_lens, real-data stride.
OPTION_PROFILES = (
    ("none", 1, False, True, False, False, 1),
    ("partial", 4, True, True, True, True, 1),
    ("all", 2, False, True, True, False, 1),
    ("partial", 1, True, False, True, True, 1),
    ("none", 1, True, True, False, True, 1),
    ("all", 4, True, True, True, True, 1),
    ("partial", 4, True, True, True, True, 3),
    ("all", 2, False, True, False, False, 2),
)


def random_case(seed: int, *, max_prefix: int, max_chunk: int, profiles: bool = False) -> CaseSpec:
    rng = random.Random(seed)
    layout = rng.choice([BatchLayout.DECODE, BatchLayout.EXTEND])
    page_size = rng.choice([1, 1, 4])
    rows = []
    for _ in range(rng.randint(1, MAX_ROWS) if rng.random() > 0.05 else 0):
        prefix = rng.choice([0, rng.randint(1, 8), rng.randint(0, max_prefix)])
        new = 1 if layout is BatchLayout.DECODE else rng.choice([0, 1, rng.randint(1, max_chunk)])
        live_earlier = [j for j, row in enumerate(rows) if not row.padded]
        shares = rng.choice(live_earlier) if live_earlier and rng.random() < 0.3 else None
        rows.append(RowSpec(prefix, new, padded=rng.random() < 0.15, shares_with=shares))
    faults = tuple(
        Fault(
            kind=rng.choice(FAULT_KINDS),
            row=rng.randrange(max(len(rows), 1)),
            where=rng.random(),
            value=rng.getrandbits(32),
        )
        for _ in range(rng.choice([0, 1, 2, 3, 4]))
    )
    options = dict(
        real_data=rng.choice(["none", "partial", "all"]),
        num_sources=rng.randint(1, 4),
        token_history=rng.random() < 0.5,
        verify_token=rng.random() < 0.8,
        expected_inputs=rng.random() < 0.5,
        host_seq_lens=rng.random() < 0.5,
        real_data_stride=rng.choice([1, 1, 2, 3]),
    )
    if profiles:
        options = dict(zip(options, rng.choice(OPTION_PROFILES)))
    return CaseSpec(
        seed=seed,
        layout=layout,
        page_size=page_size,
        rows=tuple(rows),
        faults=faults,
        predicted=rng.random() < 0.7,
        owners_known=rng.random() < 0.7,
        ring_offset=rng.choice([0, 0, 3 * 2 * POOL_SLOTS + 11]),
        **options,
    )


# ----------------------------------------------------------------------------- realization


def _materialize_prefix(sim: KvSim, rp: int, prefix: int, share: int, rng: random.Random) -> None:
    """Give request ``rp`` a clean history of ``prefix`` slots (the first ``share`` shared),
    written by earlier forwards."""
    request = sim.requests[rp]
    slots = sim.allocate(request, prefix - share)
    if not slots:
        return
    sim.state.req_to_token[rp, share:prefix] = torch.tensor(slots, dtype=torch.int32)
    records = history_records(request.tokens[:prefix], start=share)
    slot_index = torch.tensor(slots, device=sim.device)
    values = torch.tensor(records, dtype=torch.int64, device=sim.device)
    sim.state.records[slot_index, FIELD_TOKEN_POSITION] = pack_token_position(
        token=values[:, 0], position=values[:, 1]
    )
    sim.state.records[slot_index, FIELD_CHAIN] = values[:, 2]
    stamps = [rng.randint(1, STEP) for _ in slots]
    sim.state.records[slot_index, FIELD_STAMP] = torch.tensor(stamps, device=sim.device)
    real = sim.state.real_data
    if real is not None:
        sim.state.records[slot_index, FIELD_FINGERPRINT] = slot_fingerprints_torch(
            slots=slot_index, sources=real.sources, partial=real.partial
        )


def realize(spec: CaseSpec, device: str):
    """Build the sim and the batch view of ``spec`` (deterministic)."""
    rng = random.Random(spec.seed * 7919 + 1)
    longest = max([row.prefix_len + row.new_tokens for row in spec.rows], default=1)
    total = sum(row.prefix_len + row.new_tokens for row in spec.rows)
    # Pool sizes are fixed (one compiled kernel variant per option set on a GPU) and large
    # enough for every case: the ring holds every row a case can produce.
    assert longest + 4 <= MAX_CONTEXT_LEN and total + 8 * len(spec.rows) < POOL_SLOTS // 2
    sim = KvSim(
        device=device,
        page_size=spec.page_size,
        num_pages=POOL_SLOTS // spec.page_size,
        req_rows=MAX_ROWS + 2,
        max_context_len=MAX_CONTEXT_LEN,
        real_data=spec.real_data,
        num_sources=spec.num_sources,
        real_data_stride=spec.real_data_stride,
        ring_capacity=2 * POOL_SLOTS,
        seed=spec.seed,
    )
    counters = sim.state.counters
    counters[COUNTER_STEP] = STEP
    counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = STEP
    counters[COUNTER_VIOLATIONS] = spec.ring_offset
    counters[COUNTER_CONSUMED] = spec.ring_offset
    live_rows = []
    for index, row in enumerate(spec.rows):
        rp = index + 1
        tokens = [rng.randrange(50_000) for _ in range(row.prefix_len + row.new_tokens + 1)]
        share = 0
        source = spec.rows[row.shares_with] if row.shares_with is not None else None
        if source is not None and not source.padded:
            share = min(row.prefix_len, source.prefix_len) // spec.page_size * spec.page_size
            tokens[:share] = sim.requests[row.shares_with + 1].tokens[:share]
        sim.add_request(rp, tokens)
        if share:
            sim.share_prefix(req_pool_index=rp, source=row.shares_with + 1, num_tokens=share)
        _materialize_prefix(sim, rp, row.prefix_len, share, rng)
        sim.state.owner_chains[rp] = chain_at(tokens, row.prefix_len) if spec.owners_known else 0
        if not row.padded:
            live_rows.append(index)

    stale_slot = next((slot for r in sim.requests.values() for slot in r.slots), 0)
    batch_rows = []
    for index, row in enumerate(spec.rows):
        if row.padded:
            batch_rows.append(PaddedRow(row.prefix_len, row.new_tokens, stale_slot))
        elif spec.layout is BatchLayout.DECODE:
            batch_rows.append(index + 1)
        else:
            batch_rows.append((index + 1, row.new_tokens))
    options = dict(token_history=spec.token_history, expected_inputs=spec.expected_inputs,
                   host_seq_lens=spec.host_seq_lens)
    if spec.layout is BatchLayout.DECODE:
        batch = sim.decode_batch(batch_rows, **options)
    else:
        batch = sim.extend_batch(batch_rows, **options)
    batch = dataclasses.replace(batch, verify_token=spec.verify_token)
    if batch.expected_input_ids is not None and not spec.predicted:
        batch.expected_input_ids.fill_(NO_EXPECTED_TOKEN)
    # Where each live row sits in the batch, fixed before any fault edits the batch.
    batch_rows = {rp: b for b, rp in enumerate(batch.req_pool_indices.tolist())}
    first_tokens = (
        batch.extend_start_loc.tolist()
        if spec.layout is BatchLayout.EXTEND
        else list(range(batch.batch_size))
    )
    for fault in spec.faults:
        _apply_fault(sim, spec, batch, live_rows, batch_rows, first_tokens, fault)
    return sim, batch


def _apply_fault(sim, spec, batch, live_rows, batch_rows, first_tokens, fault: Fault) -> None:
    if not live_rows:
        return
    b = fault.row % len(live_rows)
    row = spec.rows[live_rows[b]]
    rp = live_rows[b] + 1
    batch_row = batch_rows[rp]
    prefix_slots = sorted(
        {
            slot
            for request in sim.requests.values()
            for slot in request.slots[: spec.rows[request.req_pool_index - 1].prefix_len]
        }
    )
    pos = int(fault.where * row.prefix_len)
    slot = int(sim.state.req_to_token[rp, pos]) if row.prefix_len else 0
    new_pos = row.prefix_len + int(fault.where * row.new_tokens)
    bit = 1 << (fault.value % 62)
    token = first_tokens[batch_row] + int(fault.where * row.new_tokens)
    has_token = spec.layout is BatchLayout.DECODE or row.new_tokens > 0
    kind = fault.kind
    if kind.startswith(("rt_", "record_", "real_kv", "history_token")) and not row.prefix_len:
        if not kind.startswith("rt_new"):
            return
    if kind == "rt_other_slot" and prefix_slots:
        sim.state.req_to_token[rp, pos] = prefix_slots[fault.value % len(prefix_slots)]
    elif kind == "rt_zero":
        sim.state.req_to_token[rp, pos] = 0
    elif kind == "rt_out_of_range":
        sim.state.req_to_token[rp, pos] = _out_of_range_slot(sim, fault.value)
    elif kind == "rt_new_other_slot" and has_token and prefix_slots:
        sim.state.req_to_token[rp, new_pos] = prefix_slots[fault.value % len(prefix_slots)]
    elif kind == "rt_new_zero" and has_token:
        sim.state.req_to_token[rp, new_pos] = 0
    elif kind.startswith("record_") and slot:
        if kind == "record_token":
            sim.state.records[slot, FIELD_TOKEN_POSITION] ^= 1 << (fault.value % 31)
        elif kind == "record_position":
            sim.state.records[slot, FIELD_TOKEN_POSITION] ^= 1 << (32 + fault.value % 31)
        elif kind == "record_stamp":
            sim.state.records[slot, FIELD_STAMP] = STEP + 1  # as if this forward wrote it
        else:
            field = FIELD_CHAIN if kind == "record_chain" else FIELD_FINGERPRINT
            sim.state.records[slot, field] ^= bit
    elif kind == "real_kv" and sim.state.real_data is not None and slot:
        source = sim.sources[fault.value % len(sim.sources)]
        source[slot, (fault.value >> 8) % source.shape[1]] ^= bit
    elif kind == "history_token" and batch.token_history is not None:
        batch.token_history[rp, pos] = fault.value % 50_000
    elif kind == "history_len" and batch.token_history_lens is not None:
        batch.token_history_lens[rp] = fault.value % (row.prefix_len + row.new_tokens + 2)
    elif kind == "prefix_shorter" and row.prefix_len:
        if spec.layout is BatchLayout.DECODE:
            batch.seq_lens[batch_row] -= 1
        else:
            batch.extend_prefix_lens[batch_row] -= 1
    elif kind == "owner_foreign":
        sim.state.owner_chains[rp] = fault.value + 1
    elif kind == "owner_unknown":
        sim.state.owner_chains[rp] = 0
    elif kind == "host_seq_lens" and batch.host_seq_lens is not None:
        batch.host_seq_lens[batch_row] += 1 + fault.value % 3
    elif kind == "seq_lens_drift_overwrite":
        if spec.layout is BatchLayout.DECODE and row.prefix_len:
            # seq_lens one short; the scheduler put the new slot at the last prefix position
            batch.seq_lens[batch_row] -= 1
            batch.positions[batch_row] -= 1
            sim.state.req_to_token[rp, row.prefix_len - 1] = int(batch.out_cache_loc[batch_row])
            sim.state.req_to_token[rp, row.prefix_len] = 0
    elif kind == "req_pool_index_out_of_range":
        batch.req_pool_indices[batch_row] = MAX_ROWS + 2 + fault.value % 5
    elif kind == "start_loc_out_of_range" and spec.layout is BatchLayout.EXTEND:
        batch.extend_start_loc[batch_row] = batch.num_tokens + fault.value % 5
    elif kind == "seq_len_negative" and spec.layout is BatchLayout.EXTEND:
        batch.extend_seq_lens[batch_row] = -1 - fault.value % 3
    elif not has_token:
        return
    elif kind == "input_id":
        batch.input_ids[token] ^= 1
    elif kind == "position":
        batch.positions[token] += 1 + fault.value % 3
    elif kind == "expected_input_id" and batch.expected_input_ids is not None:
        batch.expected_input_ids[token] += 1
    elif kind == "expected_position" and batch.expected_positions is not None:
        batch.expected_positions[token] -= 1
    elif kind == "expected_input_id_unknown" and batch.expected_input_ids is not None:
        batch.expected_input_ids[token] = NO_EXPECTED_TOKEN  # the history fallback decides
        batch.input_ids[token] ^= fault.value & 1
    elif kind == "expected_position_unknown" and batch.expected_positions is not None:
        batch.expected_positions[token] = NO_EXPECTED_TOKEN
    elif kind == "position_and_expectation" and batch.expected_positions is not None:
        batch.positions[token] += 2
        batch.expected_positions[token] += 2
    elif kind == "out_cache_loc_zero":
        batch.out_cache_loc[token] = 0
    elif kind == "out_cache_loc_out_of_range":
        batch.out_cache_loc[token] = _out_of_range_slot(sim, fault.value)


def _out_of_range_slot(sim: KvSim, value: int) -> int:
    """A slot index past the end of the pool (within the guard rows) or a negative one."""
    return -1 - value % 50 if value & 1 else sim.num_slots + value % 50


# ----------------------------------------------------------------------------- running


def run_case(spec: CaseSpec, impl: str, device: str) -> list:
    """States after the pre launch and after the post launch."""
    sim, batch = realize(spec, device)
    launches = canary_impl(impl)
    launches.launch_pre_forward(state=sim.state, batch=batch)
    after_pre = clone_state(sim.state)
    sim.model_writes_kv(batch)
    launches.launch_post_forward(state=sim.state, batch=batch)
    sim.assert_guards_intact()
    return [after_pre, clone_state(sim.state)]


def case_difference(spec: CaseSpec, device: str) -> str | None:
    expected = run_case(spec, "reference", device)
    try:
        actual = run_case(spec, "triton", device)
    except Exception as error:  # a crash is a difference too; it shrinks like one
        return f"triton raised {error!r}"
    for launch, (want, got) in zip(("pre launch", "post launch"), zip(expected, actual)):
        difference = state_difference(want, got)
        if difference:
            return f"after the {launch}: {difference}"
    return None


def shrink_candidates(spec: CaseSpec):
    for index in range(len(spec.faults)):
        yield dataclasses.replace(spec, faults=spec.faults[:index] + spec.faults[index + 1 :])
    for index in range(len(spec.rows)):
        rows = []
        for j, row in enumerate(spec.rows):
            if j == index:
                continue
            shares = row.shares_with
            if shares is not None:
                shares = None if shares == index else shares - (shares > index)
            rows.append(dataclasses.replace(row, shares_with=shares))
        yield dataclasses.replace(spec, rows=tuple(rows))
    for index, row in enumerate(spec.rows):
        smaller = []
        if row.shares_with is not None:
            smaller.append(dataclasses.replace(row, shares_with=None))
        for length in sorted({row.prefix_len // 2, row.prefix_len - 1}):
            if 0 <= length < row.prefix_len:
                smaller.append(dataclasses.replace(row, prefix_len=length))
        if spec.layout is BatchLayout.EXTEND:
            for count in sorted({row.new_tokens // 2, row.new_tokens - 1}):
                if 0 <= count < row.new_tokens:
                    smaller.append(dataclasses.replace(row, new_tokens=count))
        if row.padded:
            smaller.append(dataclasses.replace(row, padded=False))
        for candidate in smaller:
            rows = spec.rows[:index] + (candidate,) + spec.rows[index + 1 :]
            yield dataclasses.replace(spec, rows=rows)
    for option, simpler in (
        ("real_data", "none"),
        ("num_sources", 1),
        ("token_history", False),
        ("expected_inputs", False),
        ("verify_token", True),
        ("predicted", True),
        ("host_seq_lens", False),
        ("owners_known", True),
        ("real_data_stride", 1),
        ("ring_offset", 0),
        ("page_size", 1),
    ):
        if getattr(spec, option) != simpler:
            yield dataclasses.replace(spec, **{option: simpler})


def shrink(spec: CaseSpec, device: str) -> tuple[CaseSpec, str]:
    """Greedy delta debugging: keep taking the first smaller spec that still differs."""
    difference = case_difference(spec, device)
    improved = True
    while improved:
        improved = False
        for candidate in shrink_candidates(spec):
            candidate_difference = case_difference(candidate, device)
            if candidate_difference:
                spec, difference, improved = candidate, candidate_difference, True
                break
    return spec, difference


TINY_TILES = dict(row_block=4, verify_tile=16, write_tile=16, decode_write_rows=2,
                  scan_block=32, tile_elements=32, min_verify_tile=16)


TILE_SETS = ("production-tiles", "tiny-tiles")


def devices_and_tile_sets(*, cuda_tile_sets: tuple[str, ...]) -> list:
    """``(device, tile_sizes)`` cases: every tile set in the interpreter, ``cuda_tile_sets`` on
    CUDA (ids ``<tile set>-<device id>``)."""
    return [
        pytest.param(device.values[0], tiles, id=f"{tiles}-{device.id}", marks=device.marks)
        for device in TRITON_DEVICES
        for tiles in (TILE_SETS if device in INTERPRETER_DEVICES else cuda_tile_sets)
    ]


@pytest.fixture(params=TILE_SETS)
def tile_sizes(request, monkeypatch):
    if request.param == "tiny-tiles":
        kernels = canary_impl("triton")
        monkeypatch.setattr(kernels, "TILES", kernels.Tiles(**TINY_TILES))
    return request.param


# On CUDA only the production tiles draw the 200 random cases: each tile set compiles its own
# kernel variants, the tiny tiles' random cases run in the interpreter, and the tiny tiles are
# compiled and checked on CUDA by the clean pipelines below.
@pytest.mark.parametrize("device, tile_sizes",
                         devices_and_tile_sets(cuda_tile_sets=("production-tiles",)),
                         indirect=["tile_sizes"])
def test_random_cases_match_the_reference(device, tile_sizes):
    on_gpu = device == "cuda"
    num_cases = 200 if on_gpu else 30
    max_prefix, max_chunk = (600, 1100) if on_gpu else (40, 40)
    failures = []
    for seed in range(num_cases):
        spec = random_case(seed, max_prefix=max_prefix, max_chunk=max_chunk, profiles=on_gpu)
        if case_difference(spec, device):
            failures.append(shrink(spec, device))
            break
    assert not failures, "kernel != reference; shrunk case:\n{}\n{}".format(*failures[0])


@pytest.mark.parametrize("device", INTERPRETER_DEVICES)  # the shrinker is plain Python
def test_shrinking_reduces_a_failing_case_to_its_cause(device, monkeypatch):
    """The shrinker itself: a planted kernel bug (chain off by one when prefix_len > 3)."""
    spec = CaseSpec(
        seed=1,
        layout=BatchLayout.EXTEND,
        page_size=4,
        real_data="partial",
        num_sources=2,
        token_history=True,
        expected_inputs=True,
        rows=(RowSpec(9, 5), RowSpec(2, 3, padded=True), RowSpec(12, 7, shares_with=0)),
        faults=(Fault("record_token", 0, 0.5, 3), Fault("position", 1, 0.2, 1)),
        host_seq_lens=True,
    )
    assert case_difference(spec, device) is None
    kernels = canary_impl("triton")
    original = kernels.launch_pre_forward

    def planted_bug(*, state, batch):
        original(state=state, batch=batch)
        buggy = (batch.extend_prefix_lens > 3) & (batch.extend_seq_lens > 0)
        buggy &= batch.req_pool_indices != 0
        for b in buggy.nonzero().flatten().tolist():
            slot = int(batch.out_cache_loc[int(batch.extend_start_loc[b])])
            state.records[slot, FIELD_CHAIN] += 1

    monkeypatch.setattr(kernels, "launch_pre_forward", planted_bug)
    shrunk, difference = shrink(spec, device)
    assert "records differ" in difference
    assert shrunk.faults == () and not shrunk.token_history and not shrunk.expected_inputs
    assert shrunk.real_data == "none" and shrunk.page_size == 1 and not shrunk.host_seq_lens
    assert [(row.prefix_len, row.new_tokens) for row in shrunk.rows] == [(4, 1)]


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_random_clean_pipelines_match_the_reference_step_by_step(device, tile_sizes):
    """Chunked prefill, radix sharing, decode with padding: both states equal after every
    launch, and a clean workload never produces a violation."""
    rng = random.Random(7)
    sims = {impl: KvSim(device=device, page_size=4, num_pages=96, req_rows=6, max_context_len=96,
                        real_data="partial", num_sources=4, seed=11)
            for impl in ("reference", "triton")}
    prompts = {rp: [rng.randrange(1000) for _ in range(rng.randint(40, 60))] for rp in range(1, 5)}
    prompts[4][:8] = prompts[1][:8]  # shares two pages with request 1
    for sim in sims.values():
        for rp, tokens in prompts.items():
            sim.add_request(rp, tokens)
    schedule = [("extend", [(1, 13), (2, 5)]), ("extend", [(1, 7), (3, 9), (2, 0)]),
                ("share", 4), ("extend", [(4, 6), (2, 11)]), ("decode", [1, 2, 3, 4]),
                ("extend", [(3, 4), (1, 1)]), ("decode", [4, 3, 2, 1]), ("decode", [2, 4])]
    for action, argument in schedule:
        for impl, sim in sims.items():
            if action == "share":
                sim.share_prefix(req_pool_index=argument, source=1, num_tokens=8)
                continue
            checks = dict(token_history=True, expected_inputs=True, host_seq_lens=True)
            if action == "extend":
                batch = sim.extend_batch(argument, padded_rows=1, **checks)
            else:
                batch = sim.decode_batch(argument, padded_rows=2, **checks)
            sim.forward(canary_impl(impl), batch)
        if action != "share":
            difference = state_difference(sims["reference"].state, sims["triton"].state)
            assert difference is None, f"after {action} {argument}: {difference}"
    assert sims["triton"].violations() == []
    for rp in prompts:
        request = sims["triton"].requests[rp]
        expected = history_records(request.tokens[: len(request.slots)])
        assert [sims["triton"].record(slot)[:3] for slot in request.slots] == expected
        assert sims["triton"].owner(rp) == chain_at(request.tokens, len(request.slots))


import_triton_modules()  # the interpreter is chosen before the first launch

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
