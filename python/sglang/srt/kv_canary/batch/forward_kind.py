"""What kind of forward a ``ForwardBatch`` is, for the canary, from host-known values only.

Every forward the canary checks is one :class:`ForwardKind`. The kernels know two layouts:
``DECODE`` (one token per row, prefix ``seq_lens - 1``) and ``EXTEND`` (row ``b`` writes
``extend_seq_lens[b]`` tokens from ``extend_start_loc[b]`` after a prefix of
``extend_prefix_lens[b]``). The EAGLE kinds (spec v2, topk 1) are EXTEND-layout views whose
lengths and starts come from uniform blocks and whose prefix is a tensor the forward already has:

================  ========================  ==============  =========================
kind              ForwardMode               tokens per row  prefix (device)
================  ========================  ==============  =========================
DECODE            DECODE                    1               ``seq_lens - 1``
EXTEND            EXTEND, MIXED             extend_seq_lens extend_prefix_lens
TARGET_VERIFY     TARGET_VERIFY             block D         ``seq_lens``
DRAFT_EXTEND      DRAFT_EXTEND_V2           block D         ``seq_lens - D``
DRAFT_DECODE      DECODE with a draft input 1               ``positions`` (the EAGLE draft
                                                            leaves ``seq_lens`` un-bumped)
================  ========================  ==============  =========================

``D`` is the forward's token count over its row count (``speculative_num_draft_tokens``).
IDLE forwards (DP attention without rows) have no kind: nothing to check. Any other mode is
refused loudly, never run unchecked.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


class UnsupportedForwardModeError(RuntimeError):
    """A forward mode the canary does not check reached the model; it is never skipped."""


class ForwardKind(enum.Enum):
    """What one checked forward writes, per row (see the module docstring's table)."""

    DECODE = "decode"
    EXTEND = "extend"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"
    DRAFT_DECODE = "draft_decode"

    @property
    def layout(self) -> BatchLayout:
        return BatchLayout.DECODE if self is ForwardKind.DECODE else BatchLayout.EXTEND

    @property
    def speculative(self) -> bool:
        return self in (
            ForwardKind.TARGET_VERIFY, ForwardKind.DRAFT_EXTEND, ForwardKind.DRAFT_DECODE
        )


_KINDS: dict[ForwardMode, ForwardKind | None] = {
    ForwardMode.DECODE: ForwardKind.DECODE,
    ForwardMode.EXTEND: ForwardKind.EXTEND,  # prefill, chunked prefill
    ForwardMode.MIXED: ForwardKind.EXTEND,  # chunked prefill + decode rows (prefix = seq_len - 1)
    ForwardMode.TARGET_VERIFY: ForwardKind.TARGET_VERIFY,
    ForwardMode.DRAFT_EXTEND_V2: ForwardKind.DRAFT_EXTEND,
    ForwardMode.IDLE: None,  # no request rows (DP attention): nothing to verify or write
}


def _is_draft_input(forward_batch: Any) -> bool:
    spec_info = getattr(forward_batch, "spec_info", None)
    return spec_info is not None and spec_info.is_draft_input()


def forward_kind(forward_batch: ForwardBatch) -> ForwardKind | None:
    """The kind of ``forward_batch``; None for IDLE (nothing to check).

    Raises:
        UnsupportedForwardModeError: any other mode (EAGLE v1 draft extend, split prefill,
            dLLM, ...).
    """
    mode = forward_batch.forward_mode
    try:
        kind = _KINDS[mode]
    except KeyError:
        supported = ", ".join(mode.name for mode in _KINDS)
        raise UnsupportedForwardModeError(
            f"KV canary: forward mode {mode.name} is not supported (supported: "
            f"{supported}); refusing to run it unchecked. Unset SGLANG_KV_CANARY_MODE to serve "
            "this configuration without the canary."
        ) from None
    if kind is ForwardKind.DECODE and _is_draft_input(forward_batch):
        return ForwardKind.DRAFT_DECODE
    return kind


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph (the forward being run
    is recorded, not executed)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def speculative_block(forward_batch: ForwardBatch) -> int:
    """Tokens per row of a TARGET_VERIFY / DRAFT_EXTEND forward (its token count over its rows).

    Raises:
        ValueError: the token count is not a whole number of rows.
    """
    rows = forward_batch.req_pool_indices.shape[0]
    tokens = forward_batch.input_ids.shape[0]
    if rows == 0 or tokens % rows != 0:
        raise ValueError(
            f"KV canary: a {forward_batch.forward_mode.name} forward of {rows} rows has "
            f"{tokens} tokens; the canary needs the same number of tokens in every row "
            "(EAGLE chains, speculative topk 1)"
        )
    return tokens // rows


def host_prefix_lens(forward_batch: ForwardBatch) -> list[int]:
    """Tokens already in the KV cache per row before this forward, from host values only.

    Raises:
        ValueError: the host lengths the kind needs are missing.
        UnsupportedForwardModeError: see :func:`forward_kind`.
    """
    kind = forward_kind(forward_batch)
    if kind is None:
        return []
    if kind is ForwardKind.EXTEND:
        if forward_batch.extend_prefix_lens_cpu is None:
            raise ValueError(
                "KV canary needs ForwardBatch.extend_prefix_lens_cpu in "
                f"{forward_batch.forward_mode.name} mode"
            )
        return [int(n) for n in forward_batch.extend_prefix_lens_cpu]
    if forward_batch.seq_lens_cpu is None:
        raise ValueError(
            f"KV canary needs ForwardBatch.seq_lens_cpu in {forward_batch.forward_mode.name} mode"
        )
    seq_lens = forward_batch.seq_lens_cpu.tolist()
    offset = {
        ForwardKind.DECODE: -1,
        ForwardKind.TARGET_VERIFY: 0,
        ForwardKind.DRAFT_DECODE: 0,
    }.get(kind)
    if offset is None:  # DRAFT_EXTEND: seq_lens already count the block
        offset = -speculative_block(forward_batch)
    return [int(n) + offset for n in seq_lens]
