"""Scatter kernel vs torch reference on CPU, the Triton kernel run by the Triton interpreter.

Without a GPU the kernel module is (re)imported under ``TRITON_INTERPRET=1`` (``_triton_mode``).
On a GPU machine the kernel is compiled and these CPU cases are skipped: the same cases run on
CUDA in ``test_scatter_req_token_ids_gpu.py``.
"""

import os
import subprocess
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


_RUN_IN_FRESH_PROCESS = """
import os, sys
import torch
{prelude}
from sglang.jit_kernel.kv_canary import scatter_req_token_ids as scatter
pool = torch.zeros((4, 8), dtype=torch.int32)
lens = torch.zeros(4, dtype=torch.int64)
args = dict(flat_in=torch.arange(5), offsets=torch.tensor([0, 2, 5]),
            req_pool_indices=torch.tensor([1, 3]), pool_out=pool)
try:
    scatter.launch_scatter_req_token_ids_kernel(**args, history_lens_out=lens)
except ValueError as error:
    print("ValueError:", error)
    sys.exit(0)
print(pool[1, :2].tolist(), pool[3, :3].tolist(), lens.tolist())
"""


def _run_fresh(prelude: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _RUN_IN_FRESH_PROCESS.format(prelude=prelude)],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_interprets_even_when_triton_was_imported_before_the_interpreter_was_chosen() -> None:
    prelude = "import triton, triton.language\nos.environ['TRITON_INTERPRET'] = '1'"
    assert _run_fresh(prelude) == "[0, 1] [2, 3, 4] [0, 2, 0, 3]"


def test_cpu_tensors_without_the_interpreter_are_refused_by_name() -> None:
    output = _run_fresh("")
    assert output.startswith("ValueError: launch_scatter_req_token_ids_kernel needs CUDA")
    assert "TRITON_INTERPRET=1" in output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
