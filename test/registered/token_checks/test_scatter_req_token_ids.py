"""Scatter kernel vs torch reference on CPU, the Triton kernel run by the Triton interpreter.

Without a GPU the kernel module is (re)imported under ``TRITON_INTERPRET=1`` (``_triton_mode``).
On a GPU machine the kernel is compiled and these CPU cases are skipped: the same cases run on
CUDA in ``test_scatter_req_token_ids_gpu.py``.
"""

import sys

import pytest
import torch
from _triton_mode import interpret_kernels_without_cuda, kernel_is_interpreted

interpret_kernels_without_cuda()

from _scatter_cases import (  # noqa: E402
    BOTH_IMPLEMENTATIONS,
    CASES,
    CONTRACT_ERRORS,
    check_contract_error,
    check_empty_batch_is_a_no_op,
    check_kernel_matches_reference,
    check_tokens_without_rows_rejected,
)

from sglang.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=30, suite="kv-canary-cpu")


@pytest.fixture(autouse=True)
def _needs_interpreter() -> None:
    if kernel_is_interpreted():
        return
    if torch.cuda.is_available():
        pytest.skip("the Triton kernel is compiled in this process (a GPU is visible); "
                    "test_scatter_req_token_ids_gpu.py runs these cases on CUDA")
    pytest.fail("no GPU and the Triton kernel is not interpreted (see _triton_mode.py)")


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_kernel_matches_reference(case_name: str) -> None:
    check_kernel_matches_reference(CASES[case_name](), "cpu")


@BOTH_IMPLEMENTATIONS
def test_empty_batch_is_a_no_op(scatter) -> None:
    check_empty_batch_is_a_no_op("cpu", scatter)


@BOTH_IMPLEMENTATIONS
def test_tokens_without_rows_are_rejected(scatter) -> None:
    check_tokens_without_rows_rejected("cpu", scatter)


@BOTH_IMPLEMENTATIONS
@pytest.mark.parametrize("error_name", sorted(CONTRACT_ERRORS))
def test_contract_errors_name_the_argument(error_name: str, scatter) -> None:
    check_contract_error(error_name, "cpu", scatter)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
