"""Randomized differential tests: Triton kernels vs the torch reference, with shrinking.

A case is a small, fully explicit :class:`CaseSpec` (rows with prefix lengths and new tokens,
radix sharing, layout, page size, real data, token checks, and a list of faults). It is
realized deterministically into a simulated KV cache and one forward (pre launch, the model
writing K, post launch). The kernels must leave records, counters and the ring (as a multiset)
exactly as the reference does after each launch. A failing case is shrunk delta-debugging
style (drop faults and rows, shorten prefixes and chunks, switch options off) before it is
reported, so the report is a minimal reproducer.

Each case runs twice: with the production tile sizes and with tiny tiles, which turns small
cases into many tiles per row (multi-tile prefixes, the cross-tile chain scan, many items per
program).
"""

import dataclasses
import random
import sys
from dataclasses import dataclass

import pytest
import torch

from _canary_sim import (
    TRITON_DEVICES,
    KvSim,
    PaddedRow,
    canary_impl,
    clone_state,
    expected_history_records,
    state_difference,
)
from sglang.jit_kernel.kv_canary.batch_view import BatchLayout
from sglang.jit_kernel.kv_canary.consts import (
    FIELD_CHAIN,
    FIELD_FINGERPRINT,
    FIELD_POSITION,
    FIELD_TOKEN,
    NO_EXPECTED_TOKEN,
)
from sglang.jit_kernel.kv_canary.hashing import fingerprint_torch
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=40, suite="kv-canary-cpu")
register_cuda_ci(est_time=180, suite="kv-canary-gpu")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WORDS_PER_ROW = 4
MAX_ROWS = 5
MAX_CONTEXT_LEN = 2048
POOL_SLOTS = 32768
FAULT_KINDS = (
    "rt_other_slot",
    "rt_zero",
    "rt_out_of_range",
    "record_token",
    "record_position",
    "record_chain",
    "record_fingerprint",
    "real_kv",
    "input_id",
    "position",
    "expected_input_id",
    "expected_position",
    "expected_input_id_unknown",
    "expected_position_unknown",
    "position_and_expectation",
    "pool_token",
    "valid_len",
    "out_cache_loc_zero",
    "out_cache_loc_out_of_range",
    "prefix_shorter",
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
    real_kv_num_words: int
    token_pool: bool
    expected_inputs: bool
    rows: tuple[RowSpec, ...]
    faults: tuple[Fault, ...]
    verify_token: bool = True  # with the token pool: verify tokens, or only write fallbacks
    predicted: bool = True  # expected input ids given (else all NO_EXPECTED_TOKEN, as in prompts)


# ----------------------------------------------------------------------------- generation


def random_case(seed: int, *, max_prefix: int, max_chunk: int) -> CaseSpec:
    rng = random.Random(seed)
    layout = rng.choice([BatchLayout.DECODE, BatchLayout.EXTEND])
    page_size = rng.choice([1, 1, 4])
    rows = []
    for index in range(rng.randint(1, MAX_ROWS) if rng.random() > 0.05 else 0):
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
    return CaseSpec(
        seed=seed,
        layout=layout,
        page_size=page_size,
        real_kv_num_words=rng.choice([0, 2, WORDS_PER_ROW]),
        token_pool=rng.random() < 0.5,
        expected_inputs=rng.random() < 0.5,
        rows=tuple(rows),
        faults=faults,
        verify_token=rng.random() < 0.8,
        predicted=rng.random() < 0.7,
    )


# ----------------------------------------------------------------------------- realization


def _materialize_prefix(sim: KvSim, rp: int, prefix: int, share: int) -> None:
    """Give request ``rp`` a clean history of ``prefix`` slots (the first ``share`` shared)."""
    request = sim.requests[rp]
    slots = sim.allocate(request, prefix - share)
    if not slots:
        return
    sim.state.req_to_token[rp, share:prefix] = torch.tensor(slots, dtype=torch.int32)
    records = expected_history_records(request.tokens[:prefix], start=share)
    slot_index = torch.tensor(slots, device=sim.device)
    values = torch.tensor(records, dtype=torch.int64, device=sim.device)
    sim.state.records[slot_index, FIELD_TOKEN] = values[:, 0]
    sim.state.records[slot_index, FIELD_POSITION] = values[:, 1]
    sim.state.records[slot_index, FIELD_CHAIN] = values[:, 2]
    if sim.state.real_kv_num_words:
        words = sim.state.real_kv_words[slot_index, : sim.state.real_kv_num_words]
        sim.state.records[slot_index, FIELD_FINGERPRINT] = fingerprint_torch(words)


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
        words_per_row=WORDS_PER_ROW,
        real_kv_num_words=spec.real_kv_num_words,
        ring_capacity=2 * POOL_SLOTS,
        seed=spec.seed,
    )
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
        _materialize_prefix(sim, rp, row.prefix_len, share)
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
    options = dict(token_pool=spec.token_pool, expected_inputs=spec.expected_inputs)
    if spec.layout is BatchLayout.DECODE:
        batch = sim.decode_batch(batch_rows, **options)
    else:
        batch = sim.extend_batch(batch_rows, **options)
    batch = dataclasses.replace(batch, verify_token=spec.verify_token)
    if batch.expected_input_ids is not None and not spec.predicted:
        batch.expected_input_ids.fill_(NO_EXPECTED_TOKEN)
    for fault in spec.faults:
        _apply_fault(sim, spec, batch, live_rows, fault)
    return sim, batch


def _apply_fault(sim, spec, batch, live_rows, fault: Fault) -> None:
    if not live_rows:
        return
    b = fault.row % len(live_rows)
    row = spec.rows[live_rows[b]]
    rp = live_rows[b] + 1
    batch_row = [int(x) for x in batch.req_pool_indices.tolist()].index(rp)
    prefix_slots = sorted(
        {
            slot
            for request in sim.requests.values()
            for slot in request.slots[: spec.rows[request.req_pool_index - 1].prefix_len]
        }
    )
    pos = int(fault.where * row.prefix_len)
    slot = int(sim.state.req_to_token[rp, pos]) if row.prefix_len else 0
    bit = 1 << (fault.value % 62)
    if spec.layout is BatchLayout.DECODE:
        token = batch_row
    else:
        token = int(batch.extend_start_loc[batch_row]) + int(fault.where * row.new_tokens)
    has_token = spec.layout is BatchLayout.DECODE or row.new_tokens > 0
    kind = fault.kind
    if kind.startswith(("rt_", "record_", "real_kv", "pool_")) and not row.prefix_len:
        return
    if kind == "rt_other_slot" and prefix_slots:
        sim.state.req_to_token[rp, pos] = prefix_slots[fault.value % len(prefix_slots)]
    elif kind == "rt_zero":
        sim.state.req_to_token[rp, pos] = 0
    elif kind == "rt_out_of_range":
        sim.state.req_to_token[rp, pos] = _out_of_range_slot(sim, fault.value)
    elif kind.startswith("record_") and slot:
        field = {"token": FIELD_TOKEN, "position": FIELD_POSITION, "chain": FIELD_CHAIN}.get(
            kind.removeprefix("record_"), FIELD_FINGERPRINT
        )
        sim.state.records[slot, field] ^= bit
    elif kind == "real_kv" and sim.state.real_kv_num_words and slot:
        sim.state.real_kv_words[slot, fault.value % WORDS_PER_ROW] ^= bit
    elif kind == "pool_token" and batch.expected_token_pool is not None:
        batch.expected_token_pool[rp, pos] = fault.value % 50_000
    elif kind == "valid_len" and batch.expected_token_valid_lens is not None:
        batch.expected_token_valid_lens[rp] = fault.value % (row.prefix_len + row.new_tokens + 2)
    elif kind == "prefix_shorter" and row.prefix_len:
        if spec.layout is BatchLayout.DECODE:
            batch.seq_lens[batch_row] -= 1
        else:
            batch.extend_prefix_lens[batch_row] -= 1
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
    launches.launch_pre_forward_verify(state=sim.state, batch=batch)
    after_pre = clone_state(sim.state)
    sim.model_writes_kv(batch)
    launches.launch_post_forward_write_and_verify(state=sim.state, batch=batch)
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
        ("real_kv_num_words", 0),
        ("token_pool", False),
        ("expected_inputs", False),
        ("verify_token", True),
        ("predicted", True),
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


@pytest.fixture(params=["production-tiles", "tiny-tiles"])
def tile_sizes(request, monkeypatch):
    if request.param == "tiny-tiles":
        kernels = canary_impl("triton")
        monkeypatch.setattr(kernels, "_VERIFY_TILE", 16)
        monkeypatch.setattr(kernels, "_EXTEND_WRITE_TILE", 16)
        monkeypatch.setattr(kernels, "_DECODE_WRITE_TILE", 16)
        monkeypatch.setattr(kernels, "_SCAN_BLOCK", 32)
        monkeypatch.setattr(kernels, "_TILE_ELEMENTS", 32)
    return request.param


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_random_cases_match_the_reference(device, tile_sizes):
    on_gpu = device == "cuda"
    num_cases = 150 if on_gpu else 40
    max_prefix, max_chunk = (600, 1100) if on_gpu else (70, 60)
    failures = []
    for seed in range(num_cases):
        spec = random_case(seed, max_prefix=max_prefix, max_chunk=max_chunk)
        if case_difference(spec, device):
            failures.append(shrink(spec, device))
            break
    assert not failures, "kernel != reference; shrunk case:\n{}\n{}".format(*failures[0])


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_shrinking_reduces_a_failing_case_to_its_cause(device, monkeypatch):
    """The shrinker itself: a planted kernel bug (chain off by one when prefix_len > 3)."""
    spec = CaseSpec(
        seed=1,
        layout=BatchLayout.EXTEND,
        page_size=4,
        real_kv_num_words=2,
        token_pool=True,
        expected_inputs=True,
        rows=(RowSpec(9, 5), RowSpec(2, 3, padded=True), RowSpec(12, 7, shares_with=0)),
        faults=(Fault("record_token", 0, 0.5, 3), Fault("position", 1, 0.2, 1)),
    )
    assert case_difference(spec, device) is None
    kernels = canary_impl("triton")
    original = kernels.launch_post_forward_write_and_verify

    def planted_bug(*, state, batch):
        original(state=state, batch=batch)
        buggy = (batch.extend_prefix_lens > 3) & (batch.extend_seq_lens > 0)
        buggy &= batch.req_pool_indices != 0
        for b in buggy.nonzero().flatten().tolist():
            slot = int(batch.out_cache_loc[int(batch.extend_start_loc[b])])
            state.records[slot, FIELD_CHAIN] += 1

    monkeypatch.setattr(kernels, "launch_post_forward_write_and_verify", planted_bug)
    shrunk, difference = shrink(spec, device)
    assert "records differ" in difference
    assert shrunk.faults == () and not shrunk.token_pool and not shrunk.expected_inputs
    assert shrunk.real_kv_num_words == 0 and shrunk.page_size == 1
    assert [(row.prefix_len, row.new_tokens) for row in shrunk.rows] == [(4, 1)]


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_random_clean_pipelines_match_the_reference_step_by_step(device, tile_sizes):
    """Chunked prefill, radix sharing, decode with padding: both states equal after every
    launch, and a clean workload never produces a violation."""
    rng = random.Random(7)
    sims = {impl: KvSim(device=device, page_size=4, num_pages=96, req_rows=6, max_context_len=96,
                        real_kv_num_words=2, seed=11) for impl in ("reference", "triton")}
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
            checks = dict(token_pool=True, expected_inputs=True)
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
        expected = expected_history_records(request.tokens[: len(request.slots)])
        assert [sims["triton"].record(slot)[:3] for slot in request.slots] == expected


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
