"""Both canary launches captured in one torch.cuda.CUDAGraph (around a stand-in for the model's K
write) replay new batch contents exactly as eager launches do.

Two identical simulated pools run the same schedule: pool A by replaying the graph over static
batch tensors refilled before every replay (live rows, then padding rows that change from step
to step), pool B eagerly. Records, counters, violation rings and the K buffers must stay equal
after every step, including a step with a mapping fault.
"""

import random
import sys

import pytest
import torch

from _canary_sim import KvSim, PaddedRow, canary_impl, clone_state, state_difference
from sglang.jit_kernel.kv_canary.batch_view import BatchLayout, CanaryBatchView
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=30, suite="kv-canary-gpu")

pytestmark = pytest.mark.gpu

BS = 4
EXTEND_TOKENS = 24
PROMPT_LENGTHS = {1: 10, 2: 7, 3: 3, 4: 12}


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
            real_kv_num_words=2,
            seed=9,
        )
        for rp in PROMPT_LENGTHS:
            pool.add_request(rp, [rng.randrange(30_000) for _ in range(48)])
        pool.forward(canary_impl("triton"), pool.extend_batch(list(PROMPT_LENGTHS.items())))
        pools.append(pool)
    return pools[0], pools[1]


def _batch(pool: KvSim, layout: BatchLayout, rows) -> CanaryBatchView:
    checks = dict(token_pool=True, expected_inputs=True)
    if layout is BatchLayout.DECODE:
        padding = [PaddedRow()] * (BS - len(rows))
        return pool.decode_batch(list(rows) + padding, **checks)
    used = sum(count for _, count in rows)
    padding = [PaddedRow(new_tokens=EXTEND_TOKENS - used)]
    padding += [PaddedRow()] * (BS - len(rows) - 1)
    return pool.extend_batch(list(rows) + padding, **checks)


def _forward(state, kv_buffer, batch, kv_values) -> None:
    """One forward as the runtime brackets it; the model's K write in between."""
    launches = canary_impl("triton")
    launches.launch_pre_forward_verify(state=state, batch=batch)
    kv_buffer.index_copy_(0, batch.out_cache_loc, kv_values)
    launches.launch_post_forward_write_and_verify(state=state, batch=batch)


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
    values_shape = (static.num_tokens, *graph_pool.kv_buffer.shape[1:])
    static_values = torch.zeros(values_shape, dtype=torch.bfloat16, device="cuda")

    # Warm up (compile) on scratch copies, on a side stream, then capture the real state.
    scratch_state, scratch_kv = clone_state(graph_pool.state), graph_pool.kv_buffer.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _forward(scratch_state, scratch_kv, static, static_values)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _forward(graph_pool.state, graph_pool.kv_buffer, static, static_values)
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
        values = torch.randn(values_shape, generator=generator, device="cuda").to(torch.bfloat16)
        _refill(static, live)
        static_values.copy_(values)
        graph.replay()
        _forward(eager_pool.state, eager_pool.kv_buffer, twin, values)
        torch.cuda.synchronize()
        difference = state_difference(eager_pool.state, graph_pool.state)
        assert difference is None, f"step {step} ({rows}): {difference}"
        # Slot 0 takes every padding token's K write (in no defined order); never verified.
        assert torch.equal(eager_pool.kv_buffer[1:], graph_pool.kv_buffer[1:])
        graph_pool.assert_guards_intact()
    assert graph_pool.violations(), "the fault step must have produced violation rows"
    assert all(violation.req_pool_index == 2 for violation in graph_pool.violations())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
