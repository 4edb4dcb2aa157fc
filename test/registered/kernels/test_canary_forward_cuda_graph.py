"""CUDA graphs and compiled variants (needs CUDA).

- Both forward launches captured in one torch.cuda.CUDAGraph (around a stand-in for the model's
  K/V write) replay new batch contents exactly as eager launches do. Two identical simulated
  pools run the same schedule: pool A by replaying the graph over static batch tensors refilled
  before every replay (live rows, then padding rows that change from step to step), pool B
  eagerly. Records, owner chains, counters, violation rings and the K/V buffers must stay equal
  after every step, including a step with a mapping fault.
- Batch sizes and token counts never compile a new kernel variant: one variant per phase and
  option set serves batches from 1 to 4096 rows.
- Eager launches through the DirectLauncher (``jit_kernel/kv_canary/direct_launch.py``) write
  exactly what Triton's normal call writes, over the same schedules (faults included).
"""

import random
import sys

import pytest
import torch

from _canary_sim import KvSim, PaddedRow, canary_impl, clone_state, state_difference
from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout, CanaryBatchView
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="kv-canary-gpu")

pytestmark = pytest.mark.gpu

BS = 4
EXTEND_TOKENS = 24
PROMPT_LENGTHS = {1: 10, 2: 7, 3: 3, 4: 12}
CHECKS = dict(token_history=True, expected_inputs=True, host_seq_lens=True)


def _twin_pools() -> tuple[KvSim, KvSim]:
    pools = []
    for _ in range(2):
        rng = random.Random(17)
        pool = KvSim(
            device="cuda",
            page_size=4,
            num_pages=64,
            req_rows=8,
            max_context_len=64,
            real_data="partial",
            num_sources=4,
            seed=9,
        )
        for rp in PROMPT_LENGTHS:
            pool.add_request(rp, [rng.randrange(30_000) for _ in range(48)])
        pool.forward(canary_impl("triton"), pool.extend_batch(list(PROMPT_LENGTHS.items())))
        pools.append(pool)
    return pools[0], pools[1]


def _batch(pool: KvSim, layout: BatchLayout, rows) -> CanaryBatchView:
    if layout is BatchLayout.DECODE:
        padding = [PaddedRow()] * (BS - len(rows))
        return pool.decode_batch(list(rows) + padding, **CHECKS)
    used = sum(count for _, count in rows)
    padding = [PaddedRow(new_tokens=EXTEND_TOKENS - used)]
    padding += [PaddedRow()] * (BS - len(rows) - 1)
    return pool.extend_batch(list(rows) + padding, **CHECKS)


def _forward(state, kv_buffers, batch, kv_values) -> None:
    """One forward as the runtime brackets it; the model's K/V writes in between."""
    launches = canary_impl("triton")
    launches.launch_pre_forward(state=state, batch=batch)
    for buffer, values in zip(kv_buffers, kv_values):
        buffer.index_copy_(0, batch.out_cache_loc, values)
    launches.launch_post_forward(state=state, batch=batch)


def _static_copy(batch: CanaryBatchView) -> CanaryBatchView:
    """Graph-resident copies of every tensor of ``batch`` (same shapes, dtypes, device)."""
    fields = {}
    for name in CanaryBatchView.__slots__:
        value = getattr(batch, name)
        fields[name] = value.clone() if isinstance(value, torch.Tensor) else value
    return CanaryBatchView(**fields)


def _refill(static: CanaryBatchView, live: CanaryBatchView) -> None:
    for name in CanaryBatchView.__slots__:
        value = getattr(live, name)
        if isinstance(value, torch.Tensor):
            getattr(static, name).copy_(value)


SCHEDULES = {
    BatchLayout.DECODE: [[1, 2, 3], [4, 1], [1, 2, 3, 4], "fault", [2, 3], [3]],
    BatchLayout.EXTEND: [[(1, 5), (2, 3)], [(3, 7), (4, 1), (1, 2)], "fault", [(2, 6)], []],
}


@pytest.mark.parametrize("layout", [BatchLayout.DECODE, BatchLayout.EXTEND])
def test_graph_replay_matches_eager_launches(layout):
    graph_pool, eager_pool = _twin_pools()
    static = _static_copy(_batch(graph_pool, layout, []))  # padding only: allocates nothing
    static_values = [
        torch.zeros((static.num_tokens, *buffer.shape[1:]), dtype=torch.bfloat16, device="cuda")
        for buffer in graph_pool.kv_buffers
    ]

    # Warm up (compile) on scratch copies, on a side stream, then capture the real state.
    scratch_state = clone_state(graph_pool.state)
    scratch_kv = [buffer.clone() for buffer in graph_pool.kv_buffers]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _forward(scratch_state, scratch_kv, static, static_values)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _forward(graph_pool.state, graph_pool.kv_buffers, static, static_values)
    torch.cuda.synchronize()
    assert state_difference(eager_pool.state, graph_pool.state) is None  # capture ran nothing

    generator = torch.Generator(device="cuda").manual_seed(3)
    for step, rows in enumerate(SCHEDULES[layout]):
        if rows == "fault":
            for pool in (graph_pool, eager_pool):  # a pointer into another request's history
                pool.state.req_to_token[2, 2] = pool.requests[1].slots[2]
            continue
        live = _batch(graph_pool, layout, rows)
        twin = _batch(eager_pool, layout, rows)
        values = [
            torch.randn(v.shape, generator=generator, device="cuda").to(torch.bfloat16)
            for v in static_values
        ]
        _refill(static, live)
        for target, source in zip(static_values, values):
            target.copy_(source)
        graph.replay()
        _forward(eager_pool.state, eager_pool.kv_buffers, twin, values)
        torch.cuda.synchronize()
        difference = state_difference(eager_pool.state, graph_pool.state)
        assert difference is None, f"step {step} ({rows}): {difference}"
        # Slot 0 takes every padding token's K/V write (in no defined order); never verified.
        for eager_buffer, graph_buffer in zip(eager_pool.kv_buffers, graph_pool.kv_buffers):
            assert torch.equal(eager_buffer[1:], graph_buffer[1:])
        graph_pool.assert_guards_intact()
    assert graph_pool.violations(), "the fault step must have produced violation rows"
    assert all(violation.req_pool_index == 2 for violation in graph_pool.violations())


@pytest.mark.parametrize("layout", [BatchLayout.DECODE, BatchLayout.EXTEND])
def test_direct_launches_match_normal_calls(layout, monkeypatch):
    direct_pool, normal_pool = _twin_pools()
    launcher = canary_impl("triton")._LAUNCH
    assert launcher._direct, "Triton 3.6 on CUDA launches directly"
    generator = torch.Generator(device="cuda").manual_seed(5)
    schedule = SCHEDULES[layout] * 2  # every launch key repeats: the second round is direct
    for step, rows in enumerate(schedule):
        if rows == "fault":
            for pool in (direct_pool, normal_pool):
                pool.state.req_to_token[2, 2] = pool.requests[1].slots[2]
            continue
        batch = _batch(direct_pool, layout, rows)
        values = [
            torch.randn((batch.num_tokens, *buffer.shape[1:]), generator=generator,
                        device="cuda").to(torch.bfloat16)
            for buffer in direct_pool.kv_buffers
        ]
        _forward(direct_pool.state, direct_pool.kv_buffers, batch, values)
        with monkeypatch.context() as normal:
            normal.setattr(launcher, "_direct", False)
            twin = _batch(normal_pool, layout, rows)
            _forward(normal_pool.state, normal_pool.kv_buffers, twin, values)
        torch.cuda.synchronize()
        difference = state_difference(normal_pool.state, direct_pool.state)
        assert difference is None, f"step {step} ({rows}): {difference}"
    assert launcher.variants >= 2  # the pre and the post launch, each kept once at least
    assert direct_pool.violations(), "the fault steps must have produced violation rows"


def _variants() -> int:
    kernels = canary_impl("triton")
    caches = kernels._canary_forward_kernel.device_caches
    return sum(len(cache[0]) for cache in caches.values())


def test_batch_sizes_never_compile_new_variants():
    pool = KvSim(device="cuda", num_pages=64, req_rows=8, max_context_len=64)
    launches = canary_impl("triton")
    for rp in range(1, 4):
        pool.add_request(rp, list(range(rp * 100, rp * 100 + 40)))
    pool.forward(launches, pool.extend_batch([(1, 3), (2, 5), (3, 1)], **CHECKS))
    pool.forward(launches, pool.decode_batch([1, 2, 3], **CHECKS))
    before = _variants()
    for bs in (1, 7, 300, 4096):
        rows = [1, 2, 3] + [PaddedRow()] * (bs - 3) if bs >= 3 else [1]
        pool.forward(launches, pool.decode_batch(rows, **CHECKS))
        extend_rows = [(1, 2), (2, 1)] + [PaddedRow(new_tokens=1)] * max(bs - 2, 0)
        pool.forward(launches, pool.extend_batch(extend_rows, **CHECKS))
    torch.cuda.synchronize()
    assert _variants() == before
    assert pool.violations() == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
