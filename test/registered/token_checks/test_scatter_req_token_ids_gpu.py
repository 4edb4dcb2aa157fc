"""Scatter kernel vs torch reference on CUDA: the compiled Triton kernel, same cases as on CPU."""

import sys

import pytest
import torch
from _scatter_cases import (
    BOTH_IMPLEMENTATIONS,
    CASES,
    CONTRACT_ERRORS,
    ScatterCase,
    check_contract_error,
    check_empty_batch_is_a_no_op,
    check_kernel_matches_reference,
    check_tokens_without_rows_rejected,
)
from triton.runtime.interpreter import InterpretedFunction

from sglang.jit_kernel.kv_canary import scatter_req_token_ids
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="kv-canary-gpu")

_DEVICE = "cuda"


@pytest.fixture(autouse=True)
def _needs_compiled_kernel() -> None:
    if isinstance(scatter_req_token_ids._scatter_req_token_ids_kernel, InterpretedFunction):
        pytest.fail("TRITON_INTERPRET was set when the kernel module was imported in this "
                    "process; run the GPU tests in a process without it")


@pytest.mark.gpu
@pytest.mark.parametrize("case_name", sorted(CASES))
def test_kernel_matches_reference(case_name: str) -> None:
    check_kernel_matches_reference(CASES[case_name](), _DEVICE)


@pytest.mark.gpu
def test_large_batch_and_long_rows() -> None:
    """Thousands of rows (far beyond upstream's 511) and rows longer than one program."""
    generator = torch.Generator().manual_seed(7)
    batch_size = 5000
    lengths = torch.randint(0, 40, (batch_size,), generator=generator)
    lengths[::997] = 3000  # a few long rows spanning several programs, truncated at 2048
    segments = [torch.randint(0, 1 << 31, (int(n),), generator=generator).tolist()
                for n in lengths]
    case = ScatterCase(
        pool_rows=batch_size + 1,
        max_context_len=2048,
        req_pool_indices=torch.randperm(batch_size, generator=generator).add(1).tolist(),
        segments=segments,
        with_history_lens_out=True,
    )
    check_kernel_matches_reference(case, _DEVICE)


@pytest.mark.gpu
@BOTH_IMPLEMENTATIONS
def test_empty_batch_is_a_no_op(scatter) -> None:
    check_empty_batch_is_a_no_op(_DEVICE, scatter)


@pytest.mark.gpu
@BOTH_IMPLEMENTATIONS
def test_tokens_without_rows_are_rejected(scatter) -> None:
    check_tokens_without_rows_rejected(_DEVICE, scatter)


@pytest.mark.gpu
@BOTH_IMPLEMENTATIONS
@pytest.mark.parametrize("error_name", sorted(CONTRACT_ERRORS))
def test_contract_errors_name_the_argument(error_name: str, scatter) -> None:
    check_contract_error(error_name, _DEVICE, scatter)


@pytest.mark.gpu
@BOTH_IMPLEMENTATIONS
def test_cpu_tensor_with_cuda_pool_is_rejected(scatter) -> None:
    inputs = {
        "flat_in": torch.zeros(2, dtype=torch.int64),  # on the CPU
        "offsets": torch.tensor([0, 2], dtype=torch.int64, device=_DEVICE),
        "req_pool_indices": torch.tensor([1], dtype=torch.int64, device=_DEVICE),
        "pool_out": torch.zeros((2, 4), dtype=torch.int32, device=_DEVICE),
    }
    with pytest.raises(ValueError, match="flat_in is on cpu but pool_out is on cuda"):
        scatter(**inputs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
