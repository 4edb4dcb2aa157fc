"""Scatter-kernel cases shared by the CPU (Triton interpreter) and GPU test files.

Each case builds inputs on a device; :func:`check_kernel_matches_reference` runs the Triton
kernel and the torch reference on clones of one randomly filled pool (stray writes show) and
compares them exactly with each other and with an independent pure-Python expectation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from sglang.jit_kernel.kv_canary.scatter_req_token_ids import launch_scatter_req_token_ids_kernel
from sglang.jit_kernel.kv_canary.scatter_req_token_ids_ref import (
    scatter_req_token_ids_torch_reference,
)

BOTH_IMPLEMENTATIONS = pytest.mark.parametrize(
    "scatter",
    [launch_scatter_req_token_ids_kernel, scatter_req_token_ids_torch_reference],
    ids=["triton", "torch_reference"],
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScatterCase:
    """Host description of one scatter: per row its pool row, tokens and history length."""

    pool_rows: int
    max_context_len: int
    req_pool_indices: list[int]
    segments: list[list[int]]  # tokens of each batch row
    history_lens: list[int] | None = None  # None: each segment starts at position 0
    with_history_lens_out: bool = False
    pool_column_slice: bool = False  # pool_out is a strided view (columns of a wider tensor)


def _random_case(
    *, seed: int, batch_size: int, max_len: int, max_context_len: int, empty_fraction: float = 0.0,
    incremental: bool = False, with_history_lens_out: bool = False,
) -> ScatterCase:
    rng = random.Random(seed)
    pool_rows = batch_size + 3
    rows = rng.sample(range(1, pool_rows), batch_size)  # distinct rows, never the padding row
    segments = []
    history_lens = []
    for _ in range(batch_size):
        length = 0 if rng.random() < empty_fraction else rng.randint(1, max_len)
        segments.append([rng.randrange(0, 1 << 31) for _ in range(length)])
        history_lens.append(length + (rng.randint(0, max_len) if incremental else 0))
    return ScatterCase(
        pool_rows=pool_rows,
        max_context_len=max_context_len,
        req_pool_indices=rows,
        segments=segments,
        history_lens=history_lens if incremental else None,
        with_history_lens_out=with_history_lens_out,
    )


CASES: dict[str, Callable[[], ScatterCase]] = {
    "one_row": lambda: ScatterCase(
        pool_rows=4, max_context_len=16, req_pool_indices=[2], segments=[[5, 6, 7, 8]]
    ),
    "many_rows": lambda: _random_case(seed=1, batch_size=37, max_len=90, max_context_len=128),
    "rows_with_zero_tokens": lambda: ScatterCase(
        pool_rows=8, max_context_len=8, req_pool_indices=[1, 2, 3, 4, 5, 6],
        segments=[[], [11, 12], [], [], [13], []],
    ),
    "random_rows_some_empty": lambda: _random_case(
        seed=2, batch_size=50, max_len=40, max_context_len=64, empty_fraction=0.4
    ),
    "all_rows_empty": lambda: ScatterCase(
        pool_rows=4, max_context_len=4, req_pool_indices=[1, 3], segments=[[], []],
        with_history_lens_out=True,
    ),
    "truncation_at_max_context_len": lambda: ScatterCase(
        pool_rows=4, max_context_len=5, req_pool_indices=[3, 1],
        segments=[list(range(100, 112)), [7, 8, 9, 10, 11]],
    ),
    "several_programs": lambda: _random_case(
        seed=3, batch_size=5, max_len=1500, max_context_len=1400
    ),
    "large_batch_over_511_rows": lambda: _random_case(
        seed=4, batch_size=700, max_len=4, max_context_len=8, empty_fraction=0.2,
        with_history_lens_out=True,
    ),
    "more_row_starts_than_a_tile_holds": lambda: _random_case(  # runs of empty rows
        seed=6, batch_size=3000, max_len=1, max_context_len=4, empty_fraction=0.8,
        with_history_lens_out=True,
    ),
    "history_lens_tails": lambda: ScatterCase(
        pool_rows=5, max_context_len=10, req_pool_indices=[4, 1, 2],
        segments=[[1, 2], [], [3, 4, 5]], history_lens=[7, 3, 12], with_history_lens_out=True,
    ),
    "history_lens_random": lambda: _random_case(
        seed=5, batch_size=40, max_len=30, max_context_len=48, empty_fraction=0.2,
        incremental=True, with_history_lens_out=True,
    ),
    "history_lens_out_without_history_lens": lambda: ScatterCase(
        pool_rows=6, max_context_len=6, req_pool_indices=[5, 2, 3],
        segments=[[1], [2, 3, 4], []], with_history_lens_out=True,
    ),
    "strided_pool_out": lambda: ScatterCase(
        pool_rows=4, max_context_len=6, req_pool_indices=[1, 2],
        segments=[[1, 2, 3, 4, 5, 6, 7], [8, 9]], pool_column_slice=True,
    ),
}


def build_inputs(case: ScatterCase, device: str) -> dict[str, torch.Tensor | None]:
    """Device tensors of ``case``; ``pool_out`` and ``history_lens_out`` hold random values."""
    generator = torch.Generator().manual_seed(1234)
    flat = [token for segment in case.segments for token in segment]
    offsets = [0]
    for segment in case.segments:
        offsets.append(offsets[-1] + len(segment))
    width = case.max_context_len + (3 if case.pool_column_slice else 0)
    pool = torch.randint(-(1 << 31), 1 << 31, (case.pool_rows, width), generator=generator,
                         dtype=torch.int64).to(torch.int32)
    pool_out = pool.to(device)
    if case.pool_column_slice:
        pool_out = pool_out[:, 1 : 1 + case.max_context_len]
    lens_out = None
    if case.with_history_lens_out:
        lens_out = torch.randint(0, 1000, (case.pool_rows,), generator=generator).to(device)
    return {
        "flat_in": torch.tensor(flat, dtype=torch.int64, device=device),
        "offsets": torch.tensor(offsets, dtype=torch.int64, device=device),
        "req_pool_indices": torch.tensor(case.req_pool_indices, dtype=torch.int64, device=device),
        "pool_out": pool_out,
        "history_lens": (
            None if case.history_lens is None
            else torch.tensor(case.history_lens, dtype=torch.int64, device=device)
        ),
        "history_lens_out": lens_out,
    }


def expected_outputs(
    case: ScatterCase, inputs: dict[str, torch.Tensor | None]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Independent pure-Python expectation of ``(pool_out, history_lens_out)`` after the call."""
    pool = inputs["pool_out"].cpu().clone()
    lens_out = inputs["history_lens_out"]
    lens_out = None if lens_out is None else lens_out.cpu().clone()
    for b, (row, segment) in enumerate(zip(case.req_pool_indices, case.segments)):
        history_len = len(segment) if case.history_lens is None else case.history_lens[b]
        first = history_len - len(segment)
        for k, token in enumerate(segment):
            if 0 <= first + k < case.max_context_len:
                pool[row, first + k] = token - (1 << 32) if token >= (1 << 31) else token
        if lens_out is not None:
            lens_out[row] = history_len
    return pool, lens_out


def clone_inputs(inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    return {name: None if t is None else t.clone() for name, t in inputs.items()}


def check_kernel_matches_reference(case: ScatterCase, device: str) -> None:
    inputs = build_inputs(case, device)
    expected_pool, expected_lens = expected_outputs(case, inputs)
    by_kernel = clone_inputs(inputs)
    by_reference = clone_inputs(inputs)
    if case.pool_column_slice:  # clone() makes views contiguous: keep the strided layout
        by_kernel["pool_out"] = _strided_copy(inputs["pool_out"])
        by_reference["pool_out"] = _strided_copy(inputs["pool_out"])
    launch_scatter_req_token_ids_kernel(**by_kernel)
    scatter_req_token_ids_torch_reference(**by_reference)
    assert torch.equal(by_kernel["pool_out"].cpu(), expected_pool)
    assert torch.equal(by_reference["pool_out"].cpu(), expected_pool)
    if expected_lens is not None:
        assert torch.equal(by_kernel["history_lens_out"].cpu(), expected_lens)
        assert torch.equal(by_reference["history_lens_out"].cpu(), expected_lens)
    for name in ("flat_in", "offsets", "req_pool_indices", "history_lens"):
        if inputs[name] is not None:
            assert torch.equal(by_kernel[name], inputs[name]), f"kernel modified {name}"


def _strided_copy(view: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros((view.shape[0], view.shape[1] + 3), dtype=view.dtype, device=view.device)
    wide[:, 1 : 1 + view.shape[1]] = view
    strided = wide[:, 1 : 1 + view.shape[1]]
    assert not strided.is_contiguous()
    return strided


def valid_inputs(device: str) -> dict[str, torch.Tensor | None]:
    """A small valid call, the base that the contract-error cases break one argument of."""
    return build_inputs(CASES["history_lens_tails"](), device)


# (argument, replacement builder, expected exception, words the message must contain)
_ContractError = tuple[str, Callable[[str], object], type[Exception], tuple[str, ...]]
CONTRACT_ERRORS: dict[str, _ContractError] = {
    "flat_in_int32": ("flat_in", lambda d: torch.zeros(5, dtype=torch.int32, device=d),
                      TypeError, ("flat_in", "int64")),
    "flat_in_list": ("flat_in", lambda d: [1, 2, 3, 4, 5], TypeError, ("flat_in", "Tensor")),
    "flat_in_2d": ("flat_in", lambda d: torch.zeros((5, 1), dtype=torch.int64, device=d),
                   ValueError, ("flat_in", "1-D")),
    "flat_in_non_contiguous": ("flat_in", lambda d: torch.zeros(10, dtype=torch.int64,
                                                                device=d)[::2],
                               ValueError, ("flat_in", "contiguous")),
    "offsets_int32": ("offsets", lambda d: torch.tensor([0, 2, 2, 5], dtype=torch.int32,
                                                        device=d),
                      TypeError, ("offsets", "int64")),
    "offsets_wrong_length": ("offsets", lambda d: torch.tensor([0, 2, 5], dtype=torch.int64,
                                                               device=d),
                             ValueError, ("offsets", "bs + 1")),
    "req_pool_indices_int32": ("req_pool_indices",
                               lambda d: torch.tensor([4, 1, 2], dtype=torch.int32, device=d),
                               TypeError, ("req_pool_indices", "int64")),
    "req_pool_indices_2d": ("req_pool_indices",
                            lambda d: torch.tensor([[4, 1, 2]], dtype=torch.int64, device=d),
                            ValueError, ("req_pool_indices", "1-D")),
    "pool_out_int64": ("pool_out", lambda d: torch.zeros((5, 10), dtype=torch.int64, device=d),
                       TypeError, ("pool_out", "int32")),
    "pool_out_1d": ("pool_out", lambda d: torch.zeros(50, dtype=torch.int32, device=d),
                    ValueError, ("pool_out", "2-D")),
    "history_lens_int32": ("history_lens",
                           lambda d: torch.tensor([7, 3, 12], dtype=torch.int32, device=d),
                           TypeError, ("history_lens", "int64")),
    "history_lens_wrong_length": ("history_lens",
                                  lambda d: torch.tensor([7, 3], dtype=torch.int64, device=d),
                                  ValueError, ("history_lens", "[bs]")),
    "history_lens_out_int32": ("history_lens_out",
                               lambda d: torch.zeros(5, dtype=torch.int32, device=d),
                               TypeError, ("history_lens_out", "int64")),
    "history_lens_out_wrong_length": ("history_lens_out",
                                      lambda d: torch.zeros(4, dtype=torch.int64, device=d),
                                      ValueError, ("history_lens_out", "[R]")),
    "flat_in_on_another_device": ("flat_in",
                                  lambda d: torch.zeros(5, dtype=torch.int64, device="meta"),
                                  ValueError, ("flat_in", "meta", "device")),
}


def check_contract_error(name: str, device: str, scatter: Callable[..., None]) -> None:
    argument, build, error, words = CONTRACT_ERRORS[name]
    inputs = valid_inputs(device)
    inputs[argument] = build(device)
    with pytest.raises(error) as info:
        scatter(**inputs)
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


def check_tokens_without_rows_rejected(device: str, scatter: Callable[..., None]) -> None:
    with pytest.raises(ValueError, match="req_pool_indices is empty"):
        scatter(
            flat_in=torch.zeros(3, dtype=torch.int64, device=device),
            offsets=torch.zeros(1, dtype=torch.int64, device=device),
            req_pool_indices=torch.zeros(0, dtype=torch.int64, device=device),
            pool_out=torch.zeros((2, 2), dtype=torch.int32, device=device),
        )


def check_empty_batch_is_a_no_op(device: str, scatter: Callable[..., None]) -> None:
    pool = torch.arange(12, dtype=torch.int32, device=device).reshape(3, 4)
    lens = torch.arange(3, dtype=torch.int64, device=device)
    scatter(
        flat_in=torch.zeros(0, dtype=torch.int64, device=device),
        offsets=torch.zeros(1, dtype=torch.int64, device=device),
        req_pool_indices=torch.zeros(0, dtype=torch.int64, device=device),
        pool_out=pool,
        history_lens=torch.zeros(0, dtype=torch.int64, device=device),
        history_lens_out=lens,
    )
    assert torch.equal(pool.cpu(), torch.arange(12, dtype=torch.int32).reshape(3, 4))
    assert torch.equal(lens.cpu(), torch.arange(3, dtype=torch.int64))
