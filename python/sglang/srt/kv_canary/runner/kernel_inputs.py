"""From SGLang's ``ForwardBatch`` to the kernels' :class:`CanaryBatchView` (views, never copies).

Every forward the canary checks is one :class:`ForwardKind`. The kernels know two layouts:
``DECODE`` (one token per row, prefix ``seq_lens - 1``) and ``EXTEND`` (row ``b`` writes
``extend_seq_lens[b]`` tokens from ``extend_start_loc[b]`` after a prefix of
``extend_prefix_lens[b]``). The EAGLE kinds (spec v2, topk 1) are EXTEND-layout views whose
lengths and starts come from :class:`UniformBlocks` (persistent buffers) and whose prefix is a
tensor the forward already has:

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

Graph safety: only host-known shapes are used (tensor sizes and Python slices), so a view built
from the capture-time ``ForwardBatch`` of a CUDA graph points at the graph's static buffers and
every replay reads the live values (``DRAFT_EXTEND``'s prefix is one captured subtraction, a
draft step's strided ``out_cache_loc`` one captured copy).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout, CanaryBatchView
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


class UniformBlocks:
    """Persistent int64 ``extend_seq_lens`` / ``extend_start_loc`` of uniform-block forwards:
    ``block`` tokens per row, row ``b`` starting at token ``b * block``.

    Args:
        rows: rows preallocated per block size (the largest captured batch and more).
        blocks: the block sizes to preallocate (1 for draft decode steps, ``D``).
        device: where the buffers live.
    Graph safety: captured views point at the preallocated buffers; a larger eager batch grows
    them (a capture never allocates here: it raises instead).
    """

    def __init__(self, *, rows: int, blocks: tuple[int, ...], device: torch.device) -> None:
        self._device = device
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for block in blocks:
            self._buffers[block] = self._allocate(rows=rows, block=block)

    @property
    def device_bytes(self) -> int:
        return sum(2 * lengths.numel() * 8 for lengths, _ in self._buffers.values())

    def _allocate(self, *, rows: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode(False):
            lengths = torch.full((rows,), block, dtype=torch.int64, device=self._device)
            starts = torch.arange(rows, dtype=torch.int64, device=self._device) * block
        return lengths, starts

    def views(self, *, rows: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(extend_seq_lens, extend_start_loc)``, int64 ``[rows]`` views.

        Raises:
            RuntimeError: a CUDA-graph capture needs more rows (or a block) than preallocated.
        """
        buffers = self._buffers.get(block)
        if buffers is None or buffers[0].shape[0] < rows:
            if self._device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"KV canary: a captured forward needs {rows} rows of block {block}, more "
                    "than the preallocated uniform blocks"
                )
            buffers = self._allocate(rows=1 << max(rows - 1, 0).bit_length(), block=block)
            self._buffers[block] = buffers
        lengths, starts = buffers
        return lengths[:rows], starts[:rows]


def build_batch_view(
    forward_batch: ForwardBatch,
    *,
    kind: ForwardKind,
    checks: dict[str, Any],
    host_seq_lens: torch.Tensor | None,
    blocks: UniformBlocks | None = None,
) -> CanaryBatchView:
    """The canary's view of one non-IDLE forward of ``kind``.

    ``checks`` are the token-check fields (token history, write-input expectations).
    ``host_seq_lens`` is the persistent device buffer the scheduler's ``seq_lens_cpu`` is
    uploaded into before every forward (its first rows are the view's; None: no seq_lens
    invariant). A persistent buffer, so a captured graph's view reads each replay's values.
    ``blocks`` supplies the speculative kinds' lengths and starts (required for them).

    Rows with ``req_pool_indices == 0`` (CUDA-graph or DP-attention padding) are skipped by the
    kernels. For EXTEND batches the row count is taken from ``extend_prefix_lens``: DP
    attention pads ``req_pool_indices``/``seq_lens``/``extend_seq_lens`` but not the prefix
    lengths or start offsets, and the padded rows carry no tokens.

    Raises:
        ValueError: a speculative kind without ``blocks``, or with uneven rows.
    """
    common = dict(
        input_ids=forward_batch.input_ids,
        positions=forward_batch.positions,
        out_cache_loc=forward_batch.out_cache_loc,
        **checks,
    )
    if kind is ForwardKind.DECODE:
        rows = forward_batch.req_pool_indices.shape[0]
        return CanaryBatchView(
            layout=BatchLayout.DECODE,
            req_pool_indices=forward_batch.req_pool_indices,
            seq_lens=forward_batch.seq_lens,
            extend_prefix_lens=None,
            extend_seq_lens=None,
            extend_start_loc=None,
            host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
            **common,
        )
    if kind is ForwardKind.EXTEND:
        rows = forward_batch.extend_prefix_lens.shape[0]
        return CanaryBatchView(
            layout=BatchLayout.EXTEND,
            req_pool_indices=forward_batch.req_pool_indices[:rows],
            seq_lens=forward_batch.seq_lens[:rows],
            extend_prefix_lens=forward_batch.extend_prefix_lens,
            extend_seq_lens=forward_batch.extend_seq_lens[:rows],
            extend_start_loc=forward_batch.extend_start_loc,
            host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
            **common,
        )
    if blocks is None:
        raise ValueError(f"KV canary: a {kind.name} view needs the uniform blocks")
    rows = forward_batch.req_pool_indices.shape[0]
    seq_lens = forward_batch.seq_lens[:rows]
    if kind is ForwardKind.DRAFT_DECODE:
        block = 1
        prefix = forward_batch.positions[:rows]
        # a draft step's out_cache_loc is a strided row of the pass's [steps, rows] slots: one
        # captured copy (graph-pool memory inside a capture)
        common["out_cache_loc"] = forward_batch.out_cache_loc.contiguous()
    else:
        block = speculative_block(forward_batch)
        prefix = seq_lens if kind is ForwardKind.TARGET_VERIFY else seq_lens - block
    lengths, starts = blocks.views(rows=rows, block=block)
    return CanaryBatchView(
        layout=BatchLayout.EXTEND,
        req_pool_indices=forward_batch.req_pool_indices,
        seq_lens=seq_lens,
        extend_prefix_lens=prefix,
        extend_seq_lens=lengths,
        extend_start_loc=starts,
        host_seq_lens=None if host_seq_lens is None else host_seq_lens[:rows],
        **common,
    )
