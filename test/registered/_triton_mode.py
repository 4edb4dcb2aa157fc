"""Run the token-history kernels (scatter, append) in Triton's interpreter on machines without
CUDA (test support).

``triton.jit`` picks the interpreter when a kernel module is imported, so
:func:`interpret_kernels_without_cuda` sets ``TRITON_INTERPRET=1`` first and re-imports the
kernel modules and the device-function module they use (helpers first) if an earlier test
module already imported them compiled. With CUDA it changes nothing.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

KERNEL_MODULE = "sglang.jit_kernel.kv_canary.scatter_req_token_ids"
APPEND_MODULE = "sglang.jit_kernel.kv_canary.append_history"
HELPERS_MODULE = "sglang.jit_kernel.kv_canary.triton_helpers"


def kernel_is_interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    module = importlib.import_module(KERNEL_MODULE)
    return isinstance(module._scatter_req_token_ids_kernel, InterpretedFunction)


def interpret_kernels_without_cuda() -> None:
    if torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    if KERNEL_MODULE in sys.modules and not kernel_is_interpreted():
        importlib.reload(sys.modules[HELPERS_MODULE])
        importlib.reload(sys.modules[KERNEL_MODULE])
    append = sys.modules.get(APPEND_MODULE)
    if append is not None and not append._INTERPRETED:
        importlib.reload(append)
