"""The sampled-token append of the token history on the torch reference and the Triton kernel
(interpreted on a CPU, compiled on CUDA), against expectations computed one row at a time with
plain Python; its input contract; and, on CUDA, a launch captured into a graph.
"""

import random
import sys

import pytest
import torch

from _canary_sim import IMPLS, append_history_impl
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")
register_cuda_ci(est_time=20, suite="kv-canary-gpu")

POOL_ROWS, CONTEXT = 9, 16


def _expected(pool: torch.Tensor, lens_out: torch.Tensor, rows: list[int], positions: list[int],
              tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract, one row at a time."""
    pool, lens_out = pool.clone(), lens_out.clone()
    for row, position, token in zip(rows, positions, tokens):
        if not 0 < row < POOL_ROWS or not 0 <= position < CONTEXT:
            continue
        if int(lens_out[row]) != position:
            continue
        pool[row, position] = token
        lens_out[row] = position + 1
    return pool, lens_out


def _start(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, 1000, (POOL_ROWS, CONTEXT), generator=generator, dtype=torch.int32)
    lens_out = torch.randint(0, CONTEXT, (POOL_ROWS,), generator=generator, dtype=torch.int64)
    return pool, lens_out


def _run(impl: str, device: str, rows: list[int], positions: list[int], tokens: list[int], *,
         index_dtype: torch.dtype = torch.int64, start: tuple[torch.Tensor, torch.Tensor]):
    pool, lens_out = start
    expected = _expected(pool, lens_out, rows, positions, tokens)
    pool_d, lens_d = pool.to(device), lens_out.to(device)
    append_history_impl(impl).launch_append_history_tokens(
        req_pool_indices=torch.tensor(rows, dtype=index_dtype, device=device),
        seq_lens=torch.tensor(positions, dtype=index_dtype, device=device),
        tokens=torch.tensor(tokens, dtype=index_dtype, device=device),
        pool_out=pool_d, history_lens_out=lens_d,
    )
    assert torch.equal(pool_d.cpu(), expected[0])
    assert torch.equal(lens_d.cpu(), expected[1])


def _known(rows: list[int], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A start where each named row knows exactly ``positions[b]`` tokens (every append lands)."""
    pool, lens_out = _start()
    for row, position in zip(rows, positions):
        if 0 <= row < POOL_ROWS:
            lens_out[row] = position
    return pool, lens_out


CASES = {
    "one row": ([3], [5], [77], True),
    "a decode step": ([1, 4, 2, 8], [1, 9, 15, 3], [5, 6, 7, 8], True),
    "nothing to append": ([], [], [], True),
    "rows that know more (a chunked prefill's discarded sample)": ([1, 4], [2, 3], [5, 6], False),
    "padding row zero never changes": ([0, 6], [2, 3], [9, 10], True),
    "rows and positions out of range": (
        [-1, POOL_ROWS, 2, 3, 5], [4, 4, CONTEXT, -2, 0], [1, 2, 3, 4, 5], True
    ),
}


@pytest.mark.parametrize("impl, device", IMPLS)
@pytest.mark.parametrize("case_name", sorted(CASES))
def test_matches_the_contract(impl, device, case_name):
    rows, positions, tokens, caught_up = CASES[case_name]
    start = _known(rows, positions) if caught_up else _start()
    _run(impl, device, rows, positions, tokens, start=start)


@pytest.mark.parametrize("impl, device", IMPLS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_random_batches_append_exactly_where_the_row_s_history_ends(impl, device, index_dtype):
    rng = random.Random(11)
    for seed in range(12):
        n = rng.randint(1, POOL_ROWS - 1)
        rows = rng.sample(range(0, POOL_ROWS), n)
        start = _start(seed)
        # half the rows caught up (the append lands), the others ahead or behind (it does not)
        positions = [
            int(start[1][row]) if rng.random() < 0.5 else rng.randint(-1, CONTEXT)
            for row in rows
        ]
        tokens = [rng.randrange(1 << 31) for _ in rows]
        _run(impl, device, rows, positions, tokens, index_dtype=index_dtype, start=start)


@pytest.mark.parametrize("impl, device", IMPLS)
def test_the_bound_append_matches_the_contract_and_checks_each_call(impl, device):
    """Bound once to a history (what the runtime does), each call appends exactly as the
    unbound launch does, and a bad per-batch tensor is refused naming it."""
    pool, lens_out = _start(4)
    expected = (pool.clone(), lens_out.clone())
    pool_d, lens_d = pool.to(device), lens_out.to(device)
    append = append_history_impl(impl).bind_append_history_tokens(pool_out=pool_d,
                                                                  history_lens_out=lens_d)
    rng = random.Random(3)
    for _ in range(6):
        rows = rng.sample(range(1, POOL_ROWS), 3)
        positions = [int(expected[1][row]) for row in rows]
        tokens = [rng.randrange(1000) for _ in rows]
        append(req_pool_indices=torch.tensor(rows, device=device),
               seq_lens=torch.tensor(positions, device=device),
               tokens=torch.tensor(tokens, dtype=torch.int32, device=device))
        expected = _expected(*expected, rows, positions, tokens)
    assert torch.equal(pool_d.cpu(), expected[0]) and torch.equal(lens_d.cpu(), expected[1])
    good = torch.zeros(4, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="seq_lens must be contiguous"):
        append(req_pool_indices=good, seq_lens=torch.zeros(8, dtype=torch.int64,
                                                           device=device)[::2], tokens=good)
    with pytest.raises(TypeError, match="tokens must be torch.int32 or torch.int64"):
        append(req_pool_indices=good, seq_lens=good, tokens=good.to(torch.float32))
    with pytest.raises(ValueError, match="req_pool_indices must be 1-D"):
        append(req_pool_indices=good[:3], seq_lens=good, tokens=good)


def _tensors(device: str = "cpu"):
    return dict(
        req_pool_indices=torch.zeros(4, dtype=torch.int64, device=device),
        seq_lens=torch.zeros(4, dtype=torch.int64, device=device),
        tokens=torch.zeros(4, dtype=torch.int64, device=device),
        pool_out=torch.zeros(POOL_ROWS, CONTEXT, dtype=torch.int32, device=device),
        history_lens_out=torch.zeros(POOL_ROWS, dtype=torch.int64, device=device),
    )


CONTRACT_ERRORS = {
    "tokens dtype": (dict(tokens=torch.zeros(4, dtype=torch.float32)), TypeError, "tokens"),
    "rows length": (dict(req_pool_indices=torch.zeros(3, dtype=torch.int64)), ValueError,
                    "req_pool_indices"),
    "seq_lens 2-D": (dict(seq_lens=torch.zeros(2, 2, dtype=torch.int64)), ValueError,
                     "seq_lens"),
    "seq_lens strided": (dict(seq_lens=torch.zeros(8, dtype=torch.int64)[::2]), ValueError,
                         "seq_lens"),
    "pool dtype": (dict(pool_out=torch.zeros(POOL_ROWS, CONTEXT, dtype=torch.int64)), TypeError,
                   "pool_out"),
    "lens rows": (dict(history_lens_out=torch.zeros(POOL_ROWS + 1, dtype=torch.int64)),
                  ValueError, "history_lens_out"),
    "pool not a tensor": (dict(pool_out=[[0]]), TypeError, "pool_out"),
    "tokens not a tensor": (dict(tokens=[0, 0, 0, 0]), TypeError, "tokens"),
}


@pytest.mark.parametrize("impl, device", [p for p in IMPLS if "cuda" not in p.id])
@pytest.mark.parametrize("error_name", sorted(CONTRACT_ERRORS))
def test_contract_errors_name_the_argument(impl, device, error_name):
    change, error, name = CONTRACT_ERRORS[error_name]
    with pytest.raises(error, match=name):
        append_history_impl(impl).launch_append_history_tokens(**(_tensors() | change))


@pytest.mark.gpu
def test_tensors_on_different_devices_are_refused():
    arguments = _tensors("cuda") | {"tokens": torch.zeros(4, dtype=torch.int64)}
    with pytest.raises(ValueError, match="tokens is on cpu"):
        append_history_impl("triton").launch_append_history_tokens(**arguments)


@pytest.mark.gpu
def test_a_captured_launch_appends_each_replay_s_tokens():
    """Captured once; each replay reads the rows, positions and tokens its buffers hold then."""
    device = "cuda"
    rows = torch.zeros(8, dtype=torch.int64, device=device)
    positions = torch.zeros(8, dtype=torch.int64, device=device)
    tokens = torch.zeros(8, dtype=torch.int64, device=device)
    pool = torch.zeros(POOL_ROWS, CONTEXT, dtype=torch.int32, device=device)
    lens_out = torch.zeros(POOL_ROWS, dtype=torch.int64, device=device)
    launch = append_history_impl("triton").launch_append_history_tokens
    arguments = dict(req_pool_indices=rows, seq_lens=positions, tokens=tokens, pool_out=pool,
                     history_lens_out=lens_out)
    launch(**arguments)  # compile first (row 0 only: nothing appended)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(**arguments)
    expected_pool, expected_lens = pool.cpu(), lens_out.cpu()
    rng = random.Random(5)
    for step in range(6):
        batch_rows = rng.sample(range(1, POOL_ROWS), 8)
        batch_positions = [int(expected_lens[row]) for row in batch_rows]
        batch_tokens = [rng.randrange(1000) for _ in batch_rows]
        rows.copy_(torch.tensor(batch_rows))
        positions.copy_(torch.tensor(batch_positions))
        tokens.copy_(torch.tensor(batch_tokens))
        graph.replay()
        expected_pool, expected_lens = _expected(expected_pool, expected_lens, batch_rows,
                                                 batch_positions, batch_tokens)
        torch.cuda.synchronize()
        assert torch.equal(pool.cpu(), expected_pool), step
        assert torch.equal(lens_out.cpu(), expected_lens), step


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
