"""The token-history append (one token per row, read from a packed upload) on the torch
reference and the Triton kernel (interpreted on a CPU, compiled on CUDA), against expectations
computed with plain Python loops; the same result as the scatter of one-token segments; and,
on CUDA, one captured launch serving replays of different uploads.
"""

import random
import sys

import pytest
import torch

from _canary_sim import IMPLS, append_history_impl
from sglang.jit_kernel.kv_canary.scatter_req_token_ids_ref import (
    scatter_req_token_ids_torch_reference,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")
register_cuda_ci(est_time=20, suite="kv-canary-gpu")

POOL_ROWS, CONTEXT = 9, 16


def _upload(rows: list[int], lens: list[int], tokens: list[int], *, count: int | None = None,
            extra_words: int = 0) -> list[int]:
    """A packed upload of one-token rows: header, seq_lens, rows, lens, offsets, tokens."""
    n = len(rows)
    seq_lens = [length + 100 for length in lens]  # skipped by the append: any values
    offsets = list(range(n + 1))
    header = n if count is None else count
    return [header, *seq_lens, *rows, *lens, *offsets, *tokens] + [-7] * extra_words


def _expected(pool: torch.Tensor, lens_out: torch.Tensor, upload: list[int], max_rows: int):
    """The contract, one row at a time."""
    pool, lens_out = pool.clone(), lens_out.clone()
    n = upload[0]
    if n <= 0 or 2 + 5 * n > len(upload):
        return pool, lens_out
    for b in range(min(n, max_rows)):
        row, length, token = upload[1 + n + b], upload[1 + 2 * n + b], upload[2 + 4 * n + b]
        if not 0 <= row < POOL_ROWS:
            continue
        lens_out[row] = length
        if 0 <= length - 1 < CONTEXT:
            pool[row, length - 1] = token
    return pool, lens_out


def _run(impl: str, device: str, upload: list[int], *, max_rows: int):
    generator = torch.Generator().manual_seed(3)
    pool = torch.randint(0, 1000, (POOL_ROWS, CONTEXT), generator=generator, dtype=torch.int32)
    lens_out = torch.randint(0, CONTEXT, (POOL_ROWS,), generator=generator, dtype=torch.int64)
    expected = _expected(pool, lens_out, upload, max_rows)
    pool_d, lens_d = pool.to(device), lens_out.to(device)
    append_history_impl(impl).launch_append_history_tokens(
        upload=torch.tensor(upload, dtype=torch.int64, device=device), max_rows=max_rows,
        pool_out=pool_d, history_lens_out=lens_d,
    )
    assert torch.equal(pool_d.cpu(), expected[0])
    assert torch.equal(lens_d.cpu(), expected[1])
    return pool_d.cpu(), lens_d.cpu()


CASES = {
    "one row": (_upload([3], [5], [77]), 1),
    "a decode step": (_upload([1, 4, 2, 8], [1, 9, 16, 3], [5, 6, 7, 8]), 4),
    "graph padded beyond the live rows": (_upload([1, 4], [2, 3], [5, 6], extra_words=40), 64),
    "max_rows below the count": (_upload([1, 4, 2], [2, 3, 4], [5, 6, 7]), 2),
    "nothing to append": (_upload([], [], [], extra_words=30), 8),
    "a negative count": (_upload([1, 2], [3, 4], [5, 6], count=-3), 8),
    "a count the upload cannot hold": (_upload([1, 2], [3, 4], [5, 6], count=5), 8),
    "rows and positions out of range": (
        _upload([-1, POOL_ROWS, 2, 3, 5], [4, 4, 0, CONTEXT + 1, -2], [1, 2, 3, 4, 5]), 5
    ),
    "row zero is written like any row": (_upload([0, 6], [2, 3], [9, 10]), 2),
}


@pytest.mark.parametrize("impl, device", IMPLS)
@pytest.mark.parametrize("case_name", sorted(CASES))
def test_matches_the_contract(impl, device, case_name):
    upload, max_rows = CASES[case_name]
    _run(impl, device, upload, max_rows=max_rows)


@pytest.mark.parametrize("impl, device", IMPLS)
def test_random_decode_steps_match_the_scatter_of_one_token_segments(impl, device):
    rng = random.Random(11)
    for _ in range(20):
        n = rng.randint(1, POOL_ROWS - 1)
        rows = rng.sample(range(1, POOL_ROWS), n)
        lens = [rng.randint(1, CONTEXT + 2) for _ in rows]
        tokens = [rng.randrange(1 << 31) for _ in rows]
        appended = _run(impl, device, _upload(rows, lens, tokens), max_rows=n)
        generator = torch.Generator().manual_seed(3)
        pool = torch.randint(0, 1000, (POOL_ROWS, CONTEXT), generator=generator, dtype=torch.int32)
        lens_out = torch.randint(0, CONTEXT, (POOL_ROWS,), generator=generator, dtype=torch.int64)
        scatter_req_token_ids_torch_reference(
            flat_in=torch.tensor(tokens), offsets=torch.arange(n + 1),
            req_pool_indices=torch.tensor(rows), pool_out=pool,
            history_lens=torch.tensor(lens), history_lens_out=lens_out,
        )
        assert torch.equal(appended[0], pool) and torch.equal(appended[1], lens_out)


def _tensors(device: str = "cpu"):
    return dict(
        upload=torch.zeros(8, dtype=torch.int64, device=device),
        max_rows=4,
        pool_out=torch.zeros(POOL_ROWS, CONTEXT, dtype=torch.int32, device=device),
        history_lens_out=torch.zeros(POOL_ROWS, dtype=torch.int64, device=device),
    )


CONTRACT_ERRORS = {
    "upload dtype": (dict(upload=torch.zeros(8, dtype=torch.int32)), TypeError, "upload"),
    "upload 2-D": (dict(upload=torch.zeros(2, 4, dtype=torch.int64)), ValueError, "upload"),
    "upload strided": (dict(upload=torch.zeros(16, dtype=torch.int64)[::2]), ValueError, "upload"),
    "pool dtype": (dict(pool_out=torch.zeros(POOL_ROWS, CONTEXT, dtype=torch.int64)), TypeError,
                   "pool_out"),
    "lens rows": (dict(history_lens_out=torch.zeros(POOL_ROWS + 1, dtype=torch.int64)),
                  ValueError, "history_lens_out"),
    "max_rows negative": (dict(max_rows=-1), ValueError, "max_rows"),
    "max_rows not an int": (dict(max_rows=2.0), TypeError, "max_rows"),
    "pool not a tensor": (dict(pool_out=[[0]]), TypeError, "pool_out"),
}


@pytest.mark.parametrize("impl, device", [p for p in IMPLS if "cuda" not in p.id])
@pytest.mark.parametrize("error_name", sorted(CONTRACT_ERRORS))
def test_contract_errors_name_the_argument(impl, device, error_name):
    change, error, name = CONTRACT_ERRORS[error_name]
    with pytest.raises(error, match=name):
        append_history_impl(impl).launch_append_history_tokens(**(_tensors() | change))


@pytest.mark.gpu
def test_tensors_on_different_devices_are_refused():
    arguments = _tensors("cuda") | {"upload": torch.zeros(8, dtype=torch.int64)}
    with pytest.raises(ValueError, match="upload is on cpu"):
        append_history_impl("triton").launch_append_history_tokens(**arguments)


@pytest.mark.gpu
def test_one_captured_launch_applies_each_replay_s_upload():
    """Captured with a graph's batch size; each replay reads the upload area's contents then."""
    device = "cuda"
    area = torch.zeros(256, dtype=torch.int64, device=device)
    pool = torch.zeros(POOL_ROWS, CONTEXT, dtype=torch.int32, device=device)
    lens_out = torch.zeros(POOL_ROWS, dtype=torch.int64, device=device)
    launch = append_history_impl("triton").launch_append_history_tokens
    launch(upload=area, max_rows=8, pool_out=pool, history_lens_out=lens_out)  # compile first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(upload=area, max_rows=8, pool_out=pool, history_lens_out=lens_out)
    expected_pool, expected_lens = pool.cpu(), lens_out.cpu()
    rng = random.Random(5)
    for step in range(6):
        n = [3, 8, 0, 1, 5, 2][step]
        rows = rng.sample(range(1, POOL_ROWS), n)
        upload = _upload(rows, [rng.randint(1, CONTEXT) for _ in rows],
                         [rng.randrange(1000) for _ in rows])
        area[: len(upload)].copy_(torch.tensor(upload))
        graph.replay()
        expected_pool, expected_lens = _expected(expected_pool, expected_lens,
                                                 area.cpu().tolist(), 8)
        torch.cuda.synchronize()
        assert torch.equal(pool.cpu(), expected_pool), step
        assert torch.equal(lens_out.cpu(), expected_lens), step


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
