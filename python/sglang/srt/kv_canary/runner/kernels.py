"""Which implementation of the canary's kernels a runner calls.

A server always uses the Triton kernels (``sglang.jit_kernel.kv_canary.<op>``). The plain-torch
references (``<op>_ref``: same keyword signatures, identical results) drive the CPU self-check
and the CPU tests; the Triton kernels also run on a CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass

_PACKAGE = "sglang.jit_kernel.kv_canary"


class KernelBackend(enum.Enum):
    TRITON = "triton"
    TORCH_REFERENCE = "reference"

    def module(self, operation: str) -> str:
        suffix = "_ref" if self is KernelBackend.TORCH_REFERENCE else ""
        return f"{_PACKAGE}.{operation}{suffix}"


_SCATTER_FUNCTIONS: dict[KernelBackend, str] = {
    KernelBackend.TRITON: "launch_scatter_req_token_ids_kernel",
    KernelBackend.TORCH_REFERENCE: "scatter_req_token_ids_torch_reference",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryKernels:
    """The launches of one backend.

    ``pre_forward`` / ``post_forward`` take ``(*, state, batch)`` and run before / after the
    model forward (CUDA-graph capturable: no host sync, no allocation); ``sweep`` takes
    ``(*, state, entries)``; ``scatter_req_token_ids`` is the token-history scatter (keyword
    contract of ``launch_scatter_req_token_ids_kernel``); ``admission_owner_check`` takes
    ``(*, state, req_pool_indices, prefix_lens, chains)`` (deferred admissions, between the
    model forward and the post launch); ``accepted_owner_resync`` takes ``(*, state,
    req_pool_indices, out_cache_loc, accept_lens, block)`` (after an EAGLE verification). Those
    four run outside graphs. ``bind_append_history_tokens`` (keyword contract of that
    function) binds the append of the sampled tokens to one token history; the runtime calls the
    bound append after ``ModelRunner.sample`` (outside graphs). ``publish_counters`` (keyword contract of
    ``launch_publish_counters``) seals the counters for the host's copy after each forward,
    captured into decode graphs. ``rekey_loaded`` takes ``(*, state, loaded)`` (the host tier's
    loaded slots, between the model forward and the post launch; eager).
    """

    backend: KernelBackend
    pre_forward: Callable[..., None]
    post_forward: Callable[..., None]
    sweep: Callable[..., None]
    scatter_req_token_ids: Callable[..., None]
    admission_owner_check: Callable[..., None]
    accepted_owner_resync: Callable[..., None]
    bind_append_history_tokens: Callable[..., Callable[..., None]]
    publish_counters: Callable[..., None]
    rekey_loaded: Callable[..., None]


def load_kernels(backend: KernelBackend) -> CanaryKernels:
    """Import the modules of ``backend`` and return its launches."""
    forward = importlib.import_module(backend.module("canary_forward"))
    sweep = importlib.import_module(backend.module("sweep"))
    scatter = importlib.import_module(backend.module("scatter_req_token_ids"))
    admission = importlib.import_module(backend.module("admission_owner"))
    accepted = importlib.import_module(backend.module("accepted_owner"))
    append = importlib.import_module(backend.module("append_history"))
    publish = importlib.import_module(backend.module("publish_counters"))
    rekey = importlib.import_module(backend.module("rekey_loaded"))
    return CanaryKernels(
        backend=backend,
        pre_forward=forward.launch_pre_forward,
        post_forward=forward.launch_post_forward,
        sweep=sweep.launch_sweep,
        scatter_req_token_ids=getattr(scatter, _SCATTER_FUNCTIONS[backend]),
        admission_owner_check=admission.launch_admission_owner_check,
        accepted_owner_resync=accepted.launch_accepted_owner_resync,
        bind_append_history_tokens=append.bind_append_history_tokens,
        publish_counters=publish.launch_publish_counters,
        rekey_loaded=rekey.launch_rekey_loaded,
    )
