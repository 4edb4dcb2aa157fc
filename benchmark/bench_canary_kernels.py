"""Per-launch time of the KV-canary kernels on one GPU, side by side with bounds and the reference.

For decode batches (bs 1 and 64, prefixes of 1k and 8k tokens) and 8k-token prefill chunks, each
with real-data fingerprints off / partial (16 bytes) / all (a 2 KiB K row: 8 heads x 128 dims of
bf16), it prints the time of each launch (pre: verify; post: verify + write):

- ``eager``: ``triton.testing.do_bench`` of the launch from Python (L2 flushed between runs);
- ``graph``: the same launch captured in a CUDA graph, timed by replaying the graph;
- ``bound``: bytes the launch must touch / measured device-to-device copy bandwidth;
- ``torch ref``: the plain-torch reference (host loops; one timed call after a warm-up);

and the ratios ``eager / bound``, ``graph / bound`` and ``ref / eager``. The launch floor (an
empty Triton kernel, eager and replayed) is printed for scale: small configurations cannot go
below it. No assertions. Runs in well under two minutes on one H200.

Usage: ``python benchmark/bench_canary_kernels.py``
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from sglang.jit_kernel.kv_canary import canary_kernels, canary_kernels_ref
from sglang.jit_kernel.kv_canary.batch_view import BatchLayout, CanaryBatchView, CanaryDeviceState
from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    COUNTER_VIOLATIONS,
    NUM_COUNTERS,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
)
from sglang.jit_kernel.kv_canary.hashing import chain_term_torch, fingerprint_torch

DEVICE = "cuda"
KV_HEADS, HEAD_DIM = 8, 128  # one K row = 2 KiB of bf16 = 256 int64 words
REAL_DATA_WORDS = {"none": 0, "partial": 2, "all": KV_HEADS * HEAD_DIM * 2 // 8}
RECORD_BYTES = RECORD_FIELDS * 8
REQ_TO_TOKEN_BYTES = 4
TOKEN_INPUT_BYTES = 3 * 8  # input_ids, positions, out_cache_loc


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    batch: CanaryBatchView
    states: dict[str, CanaryDeviceState]  # by real-data mode
    verified_slots: int  # per verify pass
    written_slots: int


def build_scenario(*, name: str, layout: BatchLayout, bs: int, prefix: int, new: int) -> Scenario:
    """A clean paged history: ``bs`` requests with ``prefix`` cached tokens each (slots shuffled
    over the pool, as after a while of serving), and ``new`` tokens per request this forward."""
    length = prefix + new
    num_slots = 1 + bs * length
    slots = (torch.randperm(num_slots - 1, device=DEVICE) + 1).view(bs, length)
    req_to_token = torch.zeros((bs + 1, length), dtype=torch.int32, device=DEVICE)
    req_to_token[1:] = slots.to(torch.int32)
    tokens = torch.randint(0, 150_000, (bs, length), device=DEVICE)
    positions = torch.arange(length, device=DEVICE).expand(bs, length)
    terms = chain_term_torch(tokens, positions)
    chains = CHAIN_ANCHOR + torch.cumsum(terms, dim=1) - terms
    k_buffer = torch.randn((num_slots, KV_HEADS, HEAD_DIM), device=DEVICE).to(torch.bfloat16)
    words = k_buffer.view(num_slots, -1).view(torch.int64)

    cached = slots[:, :prefix].flatten()
    base_records = torch.zeros((num_slots, RECORD_FIELDS), dtype=torch.int64, device=DEVICE)
    base_records[cached] = torch.stack(
        [t[:, :prefix].flatten() for t in (tokens, positions, chains, torch.zeros_like(tokens))],
        dim=1,
    )
    states = {}
    for mode, num_words in REAL_DATA_WORDS.items():
        records = base_records.clone()
        if num_words:
            for chunk in cached.split(1 << 16):
                records[chunk, 3] = fingerprint_torch(words[chunk, :num_words])
        states[mode] = CanaryDeviceState(
            records=records,
            req_to_token=req_to_token,
            ring=torch.zeros((1024, RING_ROW_FIELDS), dtype=torch.int64, device=DEVICE),
            counters=torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=DEVICE),
            real_kv_words=words if num_words else None,
            real_kv_num_words=num_words,
        )

    def i64(values):
        return torch.as_tensor(values, dtype=torch.int64, device=DEVICE).contiguous()

    rows = torch.arange(1, bs + 1, device=DEVICE)
    extend = layout is BatchLayout.EXTEND
    batch = CanaryBatchView(
        layout=layout,
        req_pool_indices=rows,
        seq_lens=i64(torch.full((bs,), length)),
        extend_prefix_lens=i64(torch.full((bs,), prefix)) if extend else None,
        extend_seq_lens=i64(torch.full((bs,), new)) if extend else None,
        extend_start_loc=i64(torch.arange(bs) * new) if extend else None,
        input_ids=i64(tokens[:, prefix:].flatten()),
        positions=i64(positions[:, prefix:].flatten()),
        out_cache_loc=i64(slots[:, prefix:].flatten()),
    )
    return Scenario(
        name=name,
        batch=batch,
        states=states,
        verified_slots=bs * prefix,
        written_slots=bs * new,
    )


# ----------------------------------------------------------------------------- measurements


def measure_copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted)."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    target = torch.empty_like(source)
    milliseconds = triton.testing.do_bench(lambda: target.copy_(source))
    return 2 * source.numel() / (milliseconds * 1e-3)


@triton.jit
def _empty_kernel(pointer):
    pass


def graph_of(launch: Callable[[], None]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    return graph


def microseconds(launch: Callable[[], None]) -> float:
    return triton.testing.do_bench(launch) * 1e3


def host_microseconds(launch: Callable[[], None]) -> float:
    launch()
    torch.cuda.synchronize()
    start = time.perf_counter()
    launch()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6


def launch_bytes(scenario: Scenario, num_words: int, launch: str) -> int:
    verify = scenario.verified_slots * (REQ_TO_TOKEN_BYTES + RECORD_BYTES + 8 * num_words)
    if launch == "pre":
        return verify
    write = scenario.written_slots * (TOKEN_INPUT_BYTES + RECORD_BYTES + 8 * num_words)
    return verify + write


def main() -> None:
    torch.manual_seed(0)
    properties = torch.cuda.get_device_properties(0)
    bandwidth = measure_copy_bandwidth()
    dummy = torch.empty(1, device=DEVICE)
    floor_eager = microseconds(lambda: _empty_kernel[(1,)](dummy))
    floor_graph = microseconds(graph_of(lambda: _empty_kernel[(1,)](dummy)).replay)
    print(f"device: {properties.name}, {properties.multi_processor_count} SMs; torch "
          f"{torch.__version__}, triton {triton.__version__}")
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s; empty Triton kernel: "
          f"{floor_eager:.1f} us eager, {floor_graph:.1f} us replayed")
    configs = [
        ("decode bs=1 prefix=1k", BatchLayout.DECODE, 1, 1024, 1),
        ("decode bs=1 prefix=8k", BatchLayout.DECODE, 1, 8192, 1),
        ("decode bs=64 prefix=1k", BatchLayout.DECODE, 64, 1024, 1),
        ("decode bs=64 prefix=8k", BatchLayout.DECODE, 64, 8192, 1),
        ("prefill 8k chunk, prefix=0", BatchLayout.EXTEND, 1, 0, 8192),
        ("prefill 8k chunk, prefix=8k", BatchLayout.EXTEND, 1, 8192, 8192),
    ]
    header = (
        f"{'configuration':28} {'real':8} {'launch':6} {'eager us':>9} {'graph us':>9} "
        f"{'bound us':>9} {'ref us':>10} {'eager/bnd':>9} {'graph/bnd':>9} {'ref/eager':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, layout, bs, prefix, new in configs:
        scenario = build_scenario(name=name, layout=layout, bs=bs, prefix=prefix, new=new)
        for mode, state in scenario.states.items():
            for launch_name, kernel, reference in (
                ("pre", canary_kernels.launch_pre_forward_verify,
                 canary_kernels_ref.launch_pre_forward_verify),
                ("post", canary_kernels.launch_post_forward_write_and_verify,
                 canary_kernels_ref.launch_post_forward_write_and_verify),
            ):
                def launch(kernel=kernel, state=state):
                    kernel(state=state, batch=scenario.batch)

                eager = microseconds(launch)
                replayed = microseconds(graph_of(launch).replay)
                reference_time = host_microseconds(
                    lambda reference=reference, state=state: reference(
                        state=state, batch=scenario.batch
                    )
                )
                bound_us = launch_bytes(scenario, state.real_kv_num_words, launch_name)
                bound_us *= 1e6 / bandwidth
                eager_ratio, graph_ratio = (
                    (f"{eager / bound_us:9.1f}", f"{replayed / bound_us:9.1f}")
                    if bound_us
                    else (f"{'-':>9}", f"{'-':>9}")
                )
                print(
                    f"{name:28} {mode:8} {launch_name:6} {eager:9.1f} {replayed:9.1f} "
                    f"{bound_us:9.2f} {reference_time:10.0f} {eager_ratio} {graph_ratio} "
                    f"{reference_time / eager:9.0f}"
                )
            violations = int(state.counters[COUNTER_VIOLATIONS])
            if violations:
                print(f"  (unexpected: {violations} violation rows on clean data)")
        del scenario
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
