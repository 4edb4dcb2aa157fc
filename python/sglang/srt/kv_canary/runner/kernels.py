"""Which implementation of the canary's kernels the runtime calls.

The server always uses the Triton kernels (``sglang.jit_kernel.kv_canary.canary_kernels`` and,
with the token checks, ``scatter_req_token_ids``). The plain-torch references (same keyword
signatures, bit-identical results) drive the CPU self-check and the CPU tests; the Triton kernels
also run on a CPU under ``TRITON_INTERPRET=1``. The scatter module is imported only when the
token checks need it.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass


class KernelBackend(enum.Enum):
    TRITON = "triton"
    TORCH_REFERENCE = "reference"


_MODULES: dict[KernelBackend, str] = {
    KernelBackend.TRITON: "sglang.jit_kernel.kv_canary.canary_kernels",
    KernelBackend.TORCH_REFERENCE: "sglang.jit_kernel.kv_canary.canary_kernels_ref",
}
_SCATTER_MODULE = "sglang.jit_kernel.kv_canary.scatter_req_token_ids"
_SCATTER_FUNCTIONS: dict[KernelBackend, str] = {
    KernelBackend.TRITON: "launch_scatter_req_token_ids_kernel",
    KernelBackend.TORCH_REFERENCE: "scatter_req_token_ids_torch_reference",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryKernels:
    """The two launches of one forward; both take ``(*, state, batch)`` and return None.

    ``pre_forward_verify`` runs before the model forward; ``post_forward_write_and_verify``
    after it. Both are CUDA-graph capturable (no host sync, no allocation).
    """

    backend: KernelBackend
    pre_forward_verify: Callable[..., None]
    post_forward_write_and_verify: Callable[..., None]

    def scatter_req_token_ids(self) -> Callable[..., None]:
        """The token-history scatter of this backend (keyword contract of
        ``launch_scatter_req_token_ids_kernel``); runs outside graphs, before the forward."""
        module = importlib.import_module(_SCATTER_MODULE)
        return getattr(module, _SCATTER_FUNCTIONS[self.backend])


def load_kernels(backend: KernelBackend) -> CanaryKernels:
    """Import the module of ``backend`` and return its two launch functions."""
    module = importlib.import_module(_MODULES[backend])
    return CanaryKernels(
        backend=backend,
        pre_forward_verify=module.launch_pre_forward_verify,
        post_forward_write_and_verify=module.launch_post_forward_write_and_verify,
    )
