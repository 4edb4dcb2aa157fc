"""The real-data fingerprint's sources of one pool: word views of its fingerprint buffers.

Generic over the pool seam: a :class:`~.seam.CanaryPool` names the buffers, this module checks
they can be read as whole int64 words and builds the kernels'
:class:`~sglang.jit_kernel.kv_canary.kernel_inputs.RealDataSources` (views, never copies).
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import RealDataSources
from sglang.srt.kv_canary.config import RealDataMode
from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.pools.seam import CanaryPool

PARTIAL_BYTES_PER_SOURCE = 16  # SGLANG_KV_CANARY_REAL_DATA=partial: 16 bytes of each row
_WORD_BYTES = 8
_VARIABLE = "SGLANG_KV_CANARY_REAL_DATA"


def real_data_sources(
    *, pool: CanaryPool, real_data: RealDataMode, verify_stride: int = 1
) -> RealDataSources | None:
    """Word views of the pool's fingerprint buffers, or None with real data off.

    Raises:
        CanaryUnsupportedError: a buffer's rows cannot be read as whole int64 words, or are
            shorter than the 16 bytes ``partial`` reads.
    """
    if real_data is RealDataMode.NONE:
        return None
    views = []
    for source in pool.fingerprint_buffers():
        buffer, name, row_bytes = source.buffer, source.name, source.slot_bytes
        if not buffer[0].is_contiguous() or row_bytes % _WORD_BYTES != 0:
            raise CanaryUnsupportedError(
                [f"{_VARIABLE}={real_data.value} needs KV rows of whole 8-byte words, contiguous "
                 f"within a slot ({name} rows are {row_bytes} bytes); set {_VARIABLE}=none"]
            )
        if real_data is RealDataMode.PARTIAL and row_bytes < PARTIAL_BYTES_PER_SOURCE:
            raise CanaryUnsupportedError(
                [f"{_VARIABLE}=partial reads 16 bytes per row but {name} rows are {row_bytes} "
                 f"bytes; set {_VARIABLE}=all"]
            )
        views.append(buffer.view(buffer.shape[0], -1).view(torch.int64))
    return RealDataSources(sources=tuple(views), partial=real_data is RealDataMode.PARTIAL,
                           verify_stride=verify_stride)
