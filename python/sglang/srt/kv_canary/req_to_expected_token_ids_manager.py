"""Token histories for the verify-token check: host snapshot -> device expected-token pool.

The verify-token check compares the token stored in each verified slot's record with the
token the request really has at that position. The truth lives on the host, in each request's
``origin_input_ids + output_ids`` (Python lists on ``Req`` in SGLang 0.5.12.post1); the verifier
reads it from a device pool shaped like ``req_to_token``:

- ``tokens``: int32 ``[req_pool_rows, max_context_len]``; ``tokens[r, p]`` is the token at
  position ``p`` of the request that owns ``req_to_token`` row ``r``;
- ``valid_lens_by_row``: int64 ``[req_pool_rows]``; positions ``>= valid_lens_by_row[r]`` of
  row ``r`` are beyond the known history (the verifier skips them). Row 0, the padding row of
  CUDA-graph batches, is never written and stays 0.

Both are persistent device tensors with fixed addresses, so a forward replayed from a CUDA
graph reads the values refreshed before the replay: the graph's captured kernels index them with
the graph's own ``req_pool_indices`` buffer. Nothing per batch has to be copied into the graph.

Per forward, on the host and outside any graph:

1. :meth:`ReqToVerifyExpectedTokens.snapshot` (at ``ForwardBatch.init_new``, where the
   requests are known) packs what the pool lacks into one CPU int64 buffer, pinned when CUDA is
   available (:class:`ReqAllIdsInfo`);
2. :meth:`ReqToVerifyExpectedTokens.populate` (before the forward or the graph replay) copies it
   to the device without blocking and scatters it with one Triton launch that also refreshes
   ``valid_lens_by_row``.

Sync modes. ``FULL`` snapshots every request's whole history every forward (the simple
reference: O(total history) host work per forward). ``INCREMENTAL`` remembers, per pool row,
which request owns it and how many of its tokens are already in the pool, and snapshots only
the new suffix; a row whose owner changed is rewritten from position 0. Both produce identical
pools. Ownership is the request object (held by weak reference) plus its retraction count and
the identities of its two token lists, so a retracted request, a request moved to another row,
a row reused by a new request, or a history that was replaced or shrank is rewritten in full.
Bookkeeping advances only when a snapshot is actually populated, so a snapshot that is never
populated cannot leave a gap in the pool. Assumption: while a request owns a row, its history
only grows at the end, or is replaced or shortened as above. SGLang 0.5.12 edits a token in
place only in ``Req._check_vocab_boundary_finish``, on the tokens just appended, before any
snapshot can see them; an in-place edit of an already copied token would surface as a
verify-token violation that ``FULL`` mode does not report.

Streams: ``populate`` runs on the current stream and reuses one device staging buffer, so call
it for one pool from one stream (the forward stream) only.
"""

from __future__ import annotations

import enum
import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from sglang.jit_kernel.kv_canary.scatter_req_token_ids import launch_scatter_req_token_ids_kernel

# Attribute of the ForwardBatch that carries the snapshot from init_new to the forward.
FORWARD_BATCH_ATTRIBUTE = "req_all_ids_info"

# launch_scatter_req_token_ids_kernel or scatter_req_token_ids_torch_reference (same contract).
ScatterFn = Callable[..., None]

_MIN_DEVICE_STAGING_WORDS = 1 << 12


class RequestHistory(Protocol):
    """What the snapshot reads of SGLang's ``Req`` (``managers/schedule_batch.py``)."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int]
    req_pool_idx: int | None
    retraction_count: int


class TokenHistorySyncMode(enum.Enum):
    """How much of each history a snapshot carries."""

    FULL = "full"  # every token of every request, every forward (reference)
    INCREMENTAL = "incremental"  # only what the pool row does not hold yet


# (request, its retraction count, id of its origin_input_ids list, id of its output_ids list)
_OwnerKey = tuple["weakref.ref[Any]", int, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class _RowOwnership:
    """Incremental bookkeeping of one snapshot: per batch row its pool row, owner, length."""

    rows: list[int]
    owners: list[_OwnerKey]
    history_lens: list[int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReqAllIdsInfo:
    """Host snapshot of what one forward must write into the expected-token pool.

    ``packed`` is one CPU int64 tensor (pinned when requested) so a single copy moves it all:
    ``[req_pool_indices (bs) | req_all_ids_lens (bs) | offsets (bs + 1) | req_all_ids_flat (T)]``
    where ``req_all_ids_lens[b]`` is row ``b``'s whole known history length and
    ``req_all_ids_flat[offsets[b]:offsets[b + 1]]`` are the history's last tokens (all of them
    in full mode). ``ownership`` is the incremental bookkeeping, committed only when the
    snapshot is populated (None in full mode).
    """

    packed: torch.Tensor
    batch_size: int
    num_tokens: int
    ownership: _RowOwnership | None = None

    @property
    def req_pool_indices(self) -> torch.Tensor:
        return _split_packed(self.packed, self.batch_size)[0]

    @property
    def req_all_ids_lens(self) -> torch.Tensor:
        return _split_packed(self.packed, self.batch_size)[1]

    @property
    def offsets(self) -> torch.Tensor:
        return _split_packed(self.packed, self.batch_size)[2]

    @property
    def req_all_ids_flat(self) -> torch.Tensor:
        return _split_packed(self.packed, self.batch_size)[3]


def _split_packed(
    packed: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views ``(req_pool_indices, req_all_ids_lens, offsets, req_all_ids_flat)`` of ``packed``."""
    bs = batch_size
    return packed[:bs], packed[bs : 2 * bs], packed[2 * bs : 3 * bs + 1], packed[3 * bs + 1 :]


@functools.cache
def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _pack(
    *,
    rows: Sequence[int],
    history_lens: Sequence[int],
    segment_lens: Sequence[int],
    tokens: Sequence[int],
    pin_memory: bool,
    ownership: _RowOwnership | None = None,
) -> ReqAllIdsInfo:
    bs, num_tokens = len(rows), len(tokens)
    packed = torch.empty(3 * bs + 1 + num_tokens, dtype=torch.int64, pin_memory=pin_memory)
    view = packed.numpy()
    view[:bs] = rows
    view[bs : 2 * bs] = history_lens
    view[2 * bs] = 0
    np.cumsum(segment_lens, out=view[2 * bs + 1 : 3 * bs + 1])
    view[3 * bs + 1 :] = tokens
    return ReqAllIdsInfo(packed=packed, batch_size=bs, num_tokens=num_tokens, ownership=ownership)


def _pool_row(req: RequestHistory) -> int:
    row = req.req_pool_idx
    if row is None:
        raise ValueError(
            f"request {req.rid!r} is in a forward batch but has req_pool_idx=None; "
            "the token-history snapshot needs its req_to_token row"
        )
    return row


def compute_req_all_ids_info(
    reqs: Sequence[RequestHistory], *, pin_memory: bool | None = None
) -> ReqAllIdsInfo:
    """Full snapshot: every request's whole ``origin_input_ids + output_ids``.

    Args:
        reqs: the requests of one forward (``ModelWorkerBatch.reqs``), each with a
            ``req_pool_idx``.
        pin_memory: pin the host buffer; default: when CUDA is available.
    Returns:
        The snapshot (``start = 0`` for every row: ``req_all_ids_lens`` equals each segment).
    Raises:
        ValueError: a request has no ``req_pool_idx``.
    """
    rows = [_pool_row(req) for req in reqs]
    lens = [len(req.origin_input_ids) + len(req.output_ids) for req in reqs]
    tokens: list[int] = []
    for req in reqs:
        tokens += req.origin_input_ids
        tokens += req.output_ids
    return _pack(
        rows=rows,
        history_lens=lens,
        segment_lens=lens,
        tokens=tokens,
        pin_memory=_cuda_available() if pin_memory is None else pin_memory,
    )


class ReqToVerifyExpectedTokens:
    """The expected-token pool of one ``req_to_token`` pool, kept in sync with the histories.

    Share one instance between every model runner that uses the same ``req_to_token`` pool
    (target and EAGLE draft): the histories are the same, and the second runner's snapshot of a
    step is then empty.
    """

    def __init__(
        self,
        *,
        num_rows: int,
        max_context_len: int,
        device: torch.device | str,
        sync_mode: TokenHistorySyncMode = TokenHistorySyncMode.INCREMENTAL,
        scatter: ScatterFn = launch_scatter_req_token_ids_kernel,
    ) -> None:
        """Allocate the pool (``device_bytes(...)`` bytes, zeros).

        Args:
            num_rows: rows of ``req_to_token`` (``ReqToTokenPool.req_to_token.shape[0]``,
                padding row 0 included).
            max_context_len: columns of ``req_to_token``.
            device: the device of ``req_to_token``.
            sync_mode: see the module docstring.
            scatter: the scatter implementation :meth:`populate` launches (the Triton kernel;
                its torch reference on a CPU without the Triton interpreter).
        """
        if num_rows < 1 or max_context_len < 1:
            raise ValueError(
                f"num_rows and max_context_len must be >= 1, got {num_rows} and {max_context_len}"
            )
        self.sync_mode = sync_mode
        self._scatter = scatter
        self.tokens = torch.zeros((num_rows, max_context_len), dtype=torch.int32, device=device)
        self.valid_lens_by_row = torch.zeros((num_rows,), dtype=torch.int64, device=device)
        self._pin_memory = self.tokens.device.type == "cuda"
        self._device_staging = torch.empty(
            (_MIN_DEVICE_STAGING_WORDS,), dtype=torch.int64, device=device
        )
        self._row_owner: list[_OwnerKey | None] = [None] * num_rows
        self._row_synced_len: list[int] = [0] * num_rows

    @staticmethod
    def device_bytes(*, num_rows: int, max_context_len: int) -> int:
        """Device memory of the pool and its row lengths (the staging buffer grows with use)."""
        return num_rows * max_context_len * 4 + num_rows * 8 + _MIN_DEVICE_STAGING_WORDS * 8

    def snapshot(self, reqs: Sequence[RequestHistory]) -> ReqAllIdsInfo:
        """Pack what the pool needs for a forward over ``reqs`` (host only; no device work).

        Raises:
            ValueError: a request has no ``req_pool_idx``.
        """
        if self.sync_mode is TokenHistorySyncMode.FULL:
            return compute_req_all_ids_info(reqs, pin_memory=self._pin_memory)
        row_owner, row_synced_len = self._row_owner, self._row_synced_len
        rows: list[int] = []
        history_lens: list[int] = []
        segment_lens: list[int] = []
        owners: list[_OwnerKey] = []
        tokens: list[int] = []
        for req in reqs:
            row = _pool_row(req)
            origin, output = req.origin_input_ids, req.output_ids
            num_origin = len(origin)
            history_len = num_origin + len(output)
            owner = (weakref.ref(req), req.retraction_count, id(origin), id(output))
            start = row_synced_len[row] if row_owner[row] == owner else 0
            if start > history_len:  # the history shrank in place: rewrite it
                start = 0
            if start < num_origin:
                tokens += origin[start:]
                tokens += output
            else:
                tokens += output[start - num_origin :]
            rows.append(row)
            history_lens.append(history_len)
            segment_lens.append(history_len - start)
            owners.append(owner)
        return _pack(
            rows=rows,
            history_lens=history_lens,
            segment_lens=segment_lens,
            tokens=tokens,
            pin_memory=self._pin_memory,
            ownership=_RowOwnership(rows=rows, owners=owners, history_lens=history_lens),
        )

    def populate(self, info: ReqAllIdsInfo) -> None:
        """Copy ``info`` to the device (non-blocking) and scatter it into the pool.

        One host-to-device copy and one kernel launch on the current stream; no host sync.
        Must run outside CUDA graphs, before the forward (or replay) that verifies tokens.
        ``info`` must come from this instance's :meth:`snapshot` (or be a full snapshot).
        """
        if info.batch_size == 0:
            return
        num_words = info.packed.shape[0]
        if self._device_staging.shape[0] < num_words:
            self._device_staging = torch.empty(
                (1 << (num_words - 1).bit_length(),),
                dtype=torch.int64,
                device=self.tokens.device,
            )
        staging = self._device_staging[:num_words]
        staging.copy_(info.packed, non_blocking=True)
        req_pool_indices, history_lens, offsets, flat = _split_packed(staging, info.batch_size)
        self._scatter(
            flat_in=flat,
            offsets=offsets,
            req_pool_indices=req_pool_indices,
            pool_out=self.tokens,
            history_lens=history_lens,
            history_lens_out=self.valid_lens_by_row,
        )
        ownership = info.ownership
        if ownership is not None:
            row_owner, row_synced_len = self._row_owner, self._row_synced_len
            for row, owner, synced_len in zip(
                ownership.rows, ownership.owners, ownership.history_lens
            ):
                row_owner[row] = owner
                row_synced_len[row] = synced_len


def attach_req_all_ids_info(
    *,
    forward_batch: Any,
    reqs: Sequence[RequestHistory],
    req_to_verify_expected_tokens: ReqToVerifyExpectedTokens,
) -> None:
    """Snapshot ``reqs`` onto ``forward_batch`` (``FORWARD_BATCH_ATTRIBUTE``); host only.

    Called right after ``ForwardBatch.init_new`` with ``ModelWorkerBatch.reqs``.
    """
    setattr(forward_batch, FORWARD_BATCH_ATTRIBUTE, req_to_verify_expected_tokens.snapshot(reqs))


def populate_req_to_expected_token_ids(
    *, forward_batch: Any, req_to_verify_expected_tokens: ReqToVerifyExpectedTokens
) -> None:
    """Write ``forward_batch``'s snapshot into the pool (outside graphs, before the forward).

    Raises:
        RuntimeError: the forward batch carries no snapshot, so the verify-token check would
            silently compare against stale rows.
    """
    info = getattr(forward_batch, FORWARD_BATCH_ATTRIBUTE, None)
    if info is None:
        raise RuntimeError(
            f"KV canary verify-token: this ForwardBatch has no '{FORWARD_BATCH_ATTRIBUTE}' "
            "snapshot; the ForwardBatch.init_new hook (attach_req_all_ids_info) did not run for "
            "it (SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT=1 needs it for every forward)"
        )
    req_to_verify_expected_tokens.populate(info)
