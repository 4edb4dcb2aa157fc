"""Per-launch time of the KV-canary kernels on one GPU, side by side with the memory bound and the
torch reference.

Scenarios: decode batches of 1 and 64 rows with 1k / 8k-token prefixes, decode 1 x 32k, an 8k
prefill chunk (prefix 0 and 8k), and a prefill of 64 rows x 512 tokens; each with real-data
fingerprints off / partial (16 bytes per source) / all, over four sources shaped like K and V of
a first and a last layer (8 heads x 128 dims of bf16: 2 KiB per row), and ``partial+tokens``:
partial plus every check the server's "all checks" configuration gives the kernels (the token
history with verify-token, the write-input expectations, the host seq_lens mirror), and
``partial/4+tokens``: the same with ``SGLANG_KV_CANARY_REAL_DATA_STRIDE=4`` (the post launch
folds the bytes of a quarter of the prefix slots per forward). Per launch (pre, post):

- ``eager``: device time between CUDA events around one launch from Python (the host's launch
  cost shows where it exceeds the kernel's);
- ``graph``: the launch captured 20 times in one CUDA graph, replayed, per launch;
- ``bound``: bytes the launch must touch / measured device-to-device copy bandwidth;
- ``ref``: the torch reference (host loops; one timed call after a warm-up; ``--no-reference``
  skips it, which brings a run under a few minutes);

and the ratios ``graph / bound`` and ``ref / graph``. The sweep kernel is timed for 1M entries.
The floor of a launch (an empty Triton kernel, eager and replayed) is printed for scale. Timers
come from ``benchmark/timing.py``.

Repeated pre launches of one batch are not idempotent in one respect: from the second launch
on, each row's owner chain has been advanced past what its prefix chains to, so every launch
reports one owner row per row (one atomic per write item; the ring is small, so the rows are
counted, not stored). Post launches are timed on a consistent state and must report nothing.

Usage: ``python benchmark/bench_canary_kernels.py [--no-reference] [--no-sweep] [--scenarios
'bs=64 prefix=8k,...']`` (needs CUDA; more than five minutes on an H200 with the references, most
of it in them; ``--scenarios`` keeps the scenarios whose names contain one of the parts).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import (  # noqa: E402
    copy_bandwidth_bytes_per_s,
    event_time_us,
    graph_time_us,
    host_time_us,
)

from sglang.jit_kernel.kv_canary import (  # noqa: E402
    canary_forward,
    canary_forward_ref,
    sweep,
    sweep_ref,
)
from sglang.jit_kernel.kv_canary.consts import (  # noqa: E402
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
from sglang.jit_kernel.kv_canary.hashing import (  # noqa: E402
    chain_before_torch,
    chain_terms_torch,
    slot_fingerprints_torch,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import (  # noqa: E402
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    RealDataSources,
    SweepEntries,
)

DEVICE = "cuda"
KV_HEADS, HEAD_DIM = 8, 128
ROW_WORDS = KV_HEADS * HEAD_DIM * 2 // 8  # 2 KiB of bf16 per source row
NUM_SOURCES = 4  # K, V of the first layer; K, V of the last layer
# real data [/ its verify stride] [+ the token checks]
MODES = ("none", "partial", "partial+tokens", "partial/4+tokens", "all")
RING_CAPACITY = 1024
GRAPH_LAUNCHES = 20
REQ_TO_TOKEN_BYTES = 4
RECORD_BYTES = RECORD_FIELDS * 8
TOKEN_INPUT_BYTES = 3 * 8  # input_ids, positions, out_cache_loc
HISTORY_BYTES = 4  # the int32 token-history entry a verify-token check reads per slot
EXPECTED_INPUT_BYTES = 8  # the int64 expected input id of each new token
SWEEP_ENTRIES = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    layout: BatchLayout
    bs: int
    prefix: int
    new: int


SCENARIOS = (
    Scenario(name="decode bs=1 prefix=1k", layout=BatchLayout.DECODE, bs=1, prefix=1024, new=1),
    Scenario(name="decode bs=1 prefix=8k", layout=BatchLayout.DECODE, bs=1, prefix=8192, new=1),
    Scenario(name="decode bs=1 prefix=32k", layout=BatchLayout.DECODE, bs=1, prefix=32768,
             new=1),
    Scenario(name="decode bs=64 prefix=1k", layout=BatchLayout.DECODE, bs=64, prefix=1024,
             new=1),
    Scenario(name="decode bs=64 prefix=8k", layout=BatchLayout.DECODE, bs=64, prefix=8192,
             new=1),
    Scenario(name="prefill 8k chunk, prefix=0", layout=BatchLayout.EXTEND, bs=1, prefix=0,
             new=8192),
    Scenario(name="prefill 8k chunk, prefix=8k", layout=BatchLayout.EXTEND, bs=1, prefix=8192,
             new=8192),
    Scenario(name="prefill 64 x 512, prefix=0", layout=BatchLayout.EXTEND, bs=64, prefix=0,
             new=512),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """A clean paged history of ``bs`` requests (slots shuffled over the pool, as after a while
    of serving) and the forward that extends each by ``new`` tokens."""

    scenario: Scenario
    batch: CanaryBatchView
    req_to_token: torch.Tensor
    records: torch.Tensor  # prefix records, fingerprints of no source
    token_history: torch.Tensor  # int32 [bs + 1, prefix + new]: every row's whole history
    sources: tuple[torch.Tensor, ...]
    prefix_slots: torch.Tensor
    owners_before: torch.Tensor  # owner chains of the prefixes
    owners_after: torch.Tensor  # owner chains after the forward


def build_pool(scenario: Scenario, *, contiguous_slots: bool = False) -> Pool:
    """The pool of ``scenario``: slots shuffled over the pool (the worst case for the verify's
    gathers), or with ``contiguous_slots`` each request's slots in one run (a fresh server's
    allocator)."""
    bs, prefix, new = scenario.bs, scenario.prefix, scenario.new
    length = prefix + new
    num_slots = 1 + bs * length
    order = (torch.arange(num_slots - 1, device=DEVICE) if contiguous_slots
             else torch.randperm(num_slots - 1, device=DEVICE))
    slots = (order + 1).view(bs, length)
    req_to_token = torch.zeros((bs + 1, length), dtype=torch.int32, device=DEVICE)
    req_to_token[1:] = slots.to(torch.int32)
    tokens = torch.randint(0, 150_000, (bs, length), device=DEVICE)
    positions = torch.arange(length, device=DEVICE).expand(bs, length)
    chains = chain_before_torch(tokens=tokens, positions=positions)
    terms = chain_terms_torch(tokens=tokens, positions=positions)
    sources = tuple(
        torch.randint(-(1 << 62), 1 << 62, (num_slots, ROW_WORDS), device=DEVICE)
        for _ in range(NUM_SOURCES)
    )
    records = torch.zeros((num_slots, RECORD_FIELDS), dtype=torch.int64, device=DEVICE)
    cached = slots[:, :prefix].flatten()
    records[cached, FIELD_TOKEN_POSITION] = pack_token_position(
        token=tokens[:, :prefix].flatten(), position=positions[:, :prefix].flatten()
    )
    records[cached, FIELD_CHAIN] = chains[:, :prefix].flatten()
    records[cached, FIELD_STAMP] = 1
    after = chains[:, -1] + terms[:, -1]  # the chain value after each whole history
    owners_before = torch.zeros(bs + 1, dtype=torch.int64, device=DEVICE)
    owners_before[1:] = chains[:, prefix] if prefix < length else after
    owners_after = torch.zeros_like(owners_before)
    owners_after[1:] = after

    def i64(values):
        return torch.as_tensor(values, dtype=torch.int64, device=DEVICE).contiguous()

    extend = scenario.layout is BatchLayout.EXTEND
    batch = CanaryBatchView(
        layout=scenario.layout,
        req_pool_indices=torch.arange(1, bs + 1, device=DEVICE),
        seq_lens=i64(torch.full((bs,), length)),
        extend_prefix_lens=i64(torch.full((bs,), prefix)) if extend else None,
        extend_seq_lens=i64(torch.full((bs,), new)) if extend else None,
        extend_start_loc=i64(torch.arange(bs) * new) if extend else None,
        input_ids=i64(tokens[:, prefix:].flatten()),
        positions=i64(positions[:, prefix:].flatten()),
        out_cache_loc=i64(slots[:, prefix:].flatten()),
    )
    token_history = torch.zeros((bs + 1, length), dtype=torch.int32, device=DEVICE)
    token_history[1:] = tokens.to(torch.int32)
    return Pool(scenario=scenario, batch=batch, req_to_token=req_to_token, records=records,
                token_history=token_history, sources=sources, prefix_slots=cached,
                owners_before=owners_before, owners_after=owners_after)


def real_data_of(mode: str) -> str:
    return mode.split("+")[0].split("/")[0]


def stride_of(mode: str) -> int:
    """The real-data verify stride of ``mode`` (``partial/4``: 4)."""
    real = mode.split("+")[0]
    return int(real.split("/")[1]) if "/" in real else 1


def batch_of(pool: Pool, mode: str) -> CanaryBatchView:
    """The pool's forward with the token checks of ``mode`` (``+tokens``: all of them)."""
    if not mode.endswith("+tokens"):
        return pool.batch
    batch = pool.batch
    history_lens = torch.full((pool.token_history.shape[0],), pool.token_history.shape[1],
                              dtype=torch.int64, device=DEVICE)
    return dataclasses.replace(
        batch, token_history=pool.token_history, token_history_lens=history_lens,
        expected_input_ids=batch.input_ids.clone(), host_seq_lens=batch.seq_lens.clone(),
    )


def state_of(pool: Pool, mode: str) -> CanaryDeviceState:
    """A fresh state of ``pool`` with the prefix fingerprints of ``mode``'s real data."""
    real = None
    records = pool.records.clone()
    if real_data_of(mode) != "none":
        real = RealDataSources(sources=pool.sources, partial=real_data_of(mode) == "partial",
                               verify_stride=stride_of(mode))
        for chunk in pool.prefix_slots.split(1 << 15):
            records[chunk, FIELD_FINGERPRINT] = slot_fingerprints_torch(
                slots=chunk, sources=real.sources, partial=real.partial
            )
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=DEVICE)
    counters[COUNTER_STEP] = 1
    counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = 1
    return CanaryDeviceState(
        records=records,
        req_to_token=pool.req_to_token,
        ring=torch.zeros((RING_CAPACITY, RING_ROW_FIELDS), dtype=torch.int64, device=DEVICE),
        counters=counters,
        owner_chains=pool.owners_before.clone(),
        real_data=real,
    )


def clone(state: CanaryDeviceState) -> CanaryDeviceState:
    return CanaryDeviceState(
        records=state.records.clone(), req_to_token=state.req_to_token,
        ring=state.ring.clone(), counters=state.counters.clone(),
        owner_chains=state.owner_chains.clone(), real_data=state.real_data,
    )


# ----------------------------------------------------------------------------- bounds


def slot_bytes(mode: str, *, launch: str) -> int:
    """Bytes a verify reads per slot: a req_to_token entry, the record, the real-data words (the
    post launch: ``partial`` reads the 16 bytes of one source per due slot, ``all`` every row;
    the sweep: every source; the pre launch none), the token-history entry."""
    real_data = real_data_of(mode)
    record = 16 if real_data == "none" or launch == "pre" else RECORD_BYTES
    real = 0
    if launch != "pre":
        partial = 16 * (NUM_SOURCES if launch == "sweep" else 1)
        real = {"none": 0, "partial": partial, "all": ROW_WORDS * 8 * NUM_SOURCES}[real_data]
        real //= stride_of(mode)
    history = HISTORY_BYTES if mode.endswith("+tokens") else 0
    return REQ_TO_TOKEN_BYTES + record + real + history


def launch_bytes(scenario: Scenario, mode: str, launch: str) -> int:
    rows, new = scenario.bs, scenario.new
    if launch == "pre":
        expected = EXPECTED_INPUT_BYTES if mode.endswith("+tokens") else 0
        return rows * scenario.prefix * slot_bytes(mode, launch=launch) + rows * new * (
            TOKEN_INPUT_BYTES + RECORD_BYTES + expected
        )
    return rows * (scenario.prefix + new) * slot_bytes(mode, launch=launch)


# ----------------------------------------------------------------------------- timing


@triton.jit
def _empty_kernel(pointer):
    tl.store(pointer, 0.0, mask=False)


def _ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:9.1f}" if denominator > 0 < numerator else f"{'-':>9}"


def time_launches(pool: Pool, mode: str, bandwidth: float, *, reference_timed: bool) -> list[str]:
    scenario = pool.scenario
    lines = []
    state = state_of(pool, mode)
    batch = batch_of(pool, mode)

    def pre() -> None:
        canary_forward.launch_pre_forward(state=state, batch=batch)

    def post() -> None:
        canary_forward.launch_post_forward(state=state, batch=batch)

    for name, launch, reference in (
        ("pre", pre, canary_forward_ref.launch_pre_forward),
        ("post", post, canary_forward_ref.launch_post_forward),
    ):
        if name == "post":  # a consistent state: the records of this forward's pre launch
            state.owner_chains.copy_(pool.owners_after)
            state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = (
                state.counters[COUNTER_STEP] + 1
            )
            state.counters[COUNTER_VIOLATIONS] = 0
        eager = event_time_us(fn=launch).median
        graph = graph_time_us(fn=launch, launches=GRAPH_LAUNCHES).median
        reference_us = 0.0
        if reference_timed:
            reference_state = clone(state)
            reference_us = host_time_us(
                fn=lambda: (reference(state=reference_state, batch=batch),
                            torch.cuda.synchronize()),
                repeats=1,
            ).median
        bound = launch_bytes(scenario, mode, name) / bandwidth * 1e6
        lines.append(
            f"{scenario.name:28} {mode:14} {name:5} {eager:9.1f} {graph:9.1f} {bound:9.2f} "
            f"{reference_us:11.0f} {_ratio(graph, bound)} {_ratio(reference_us, graph)}"
        )
    torch.cuda.synchronize()
    violations = int(state.counters[COUNTER_VIOLATIONS])
    if violations:
        lines.append(f"  (unexpected: {violations} violation rows from post launches)")
    return lines


def time_sweep(bandwidth: float, *, reference_timed: bool) -> Iterator[str]:
    """The sweep over ``SWEEP_ENTRIES`` slots of one long clean history (a line per mode, as
    each is timed)."""
    pool = build_pool(Scenario(name="sweep", layout=BatchLayout.EXTEND, bs=1,
                               prefix=SWEEP_ENTRIES, new=0))
    slots = pool.req_to_token[1].to(torch.int64)
    prev_slots = torch.cat([torch.full((1,), -1, device=DEVICE), slots[:-1]])
    positions = torch.arange(SWEEP_ENTRIES, device=DEVICE)
    tokens = torch.full_like(slots, -1)
    entries = SweepEntries(slots=slots, prev_slots=prev_slots, positions=positions, tokens=tokens)
    for mode in ("none", "partial", "all"):  # the sweep has no token checks
        state = state_of(pool, mode)
        eager = event_time_us(fn=lambda: sweep.launch_sweep(state=state, entries=entries)).median
        reference_us = 0.0
        if reference_timed:
            reference_us = host_time_us(
                fn=lambda: (sweep_ref.launch_sweep(state=clone(state), entries=entries),
                            torch.cuda.synchronize()),
                repeats=1,
            ).median
        bound = SWEEP_ENTRIES * (32 + slot_bytes(mode, launch="sweep") - REQ_TO_TOKEN_BYTES
                                 ) / bandwidth * 1e6
        violations = int(state.counters[COUNTER_VIOLATIONS])
        yield (
            f"{'sweep 1M entries':28} {mode:14} {'sweep':5} {eager:9.1f} {'-':>9} {bound:9.2f} "
            f"{reference_us:11.0f} {_ratio(eager, bound)} {_ratio(reference_us, eager)}"
            + (f"  (unexpected: {violations} violation rows)" if violations else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-reference", action="store_true",
                        help="do not time the torch references (their column shows 0)")
    parser.add_argument("--scenarios", default="",
                        help="comma-separated parts of scenario names to time (default: all), "
                        "e.g. 'bs=64 prefix=8k,bs=1 prefix=32k'")
    parser.add_argument("--no-sweep", action="store_true", help="do not time the sweep")
    args = parser.parse_args()
    reference_timed = not args.no_reference
    wanted = [part.strip() for part in args.scenarios.split(",") if part.strip()]
    scenarios = [s for s in SCENARIOS if not wanted or any(w in s.name for w in wanted)]
    if not scenarios:
        parser.error(f"--scenarios {args.scenarios!r} matches none of: "
                     + "; ".join(s.name for s in SCENARIOS))
    torch.manual_seed(0)
    properties = torch.cuda.get_device_properties(0)
    bandwidth = copy_bandwidth_bytes_per_s()
    dummy = torch.empty(1, device=DEVICE)
    floor_eager = event_time_us(fn=lambda: _empty_kernel[(1,)](dummy)).median
    floor_graph = graph_time_us(fn=lambda: _empty_kernel[(1,)](dummy)).median
    print(f"device: {properties.name}, {properties.multi_processor_count} SMs; torch "
          f"{torch.__version__}, triton {triton.__version__}")
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s; empty Triton kernel: "
          f"{floor_eager:.1f} us eager, {floor_graph:.1f} us replayed")
    header = (
        f"{'configuration':28} {'checks':14} {'launch':5} {'eager us':>9} {'graph us':>9} "
        f"{'bound us':>9} {'ref us':>11} {'graph/bnd':>9} {'ref/graph':>9}"
    )
    print(header)
    print("-" * len(header))
    # the sweep first: the scenarios' torch references take minutes, and a run cut short by a
    # time limit should still have printed the sweep's line
    if not args.no_sweep:
        for line in time_sweep(bandwidth, reference_timed=reference_timed):
            print(line, flush=True)
    for scenario in scenarios:
        pool = build_pool(scenario)
        for mode in MODES:
            for line in time_launches(pool, mode, bandwidth, reference_timed=reference_timed):
                print(line, flush=True)
        del pool
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
