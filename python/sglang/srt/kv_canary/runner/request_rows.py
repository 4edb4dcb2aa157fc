"""Host bookkeeping of ``req_to_token`` rows: which request owns each row, and what the device
already knows about it.

Per forward the host uploads the scheduler's ``seq_lens`` mirror of each batch row (the
seq_lens invariant compares it with the device ``seq_lens`` the forward uses), and two
device-side facts are kept per request row and refreshed:

* the **token history** (verify-token, write-input assert): the request's
  ``origin_input_ids + output_ids``; only the tokens the device pool lacks are sent;
* the **owner chain** (ownership check): the chain value the row's next position must have,
  i.e. ``CHAIN_ANCHOR + sum(chain_term(t_q, q) for q < prefix_len)`` over the request's own
  tokens. The device keeps it up to date for a row whose owner did not change (the write
  launch advances it); the host computes it only for a row that has a new owner (a new
  request, a retracted request admitted again, a request moved to another row), in
  O(prefix) once per admission: one pass over the request's token lists into an int64 array
  (shared with the token history when that is on) and a vectorized sum, about 1.3-1.6x the
  cost of reading the lists at all (``benchmark/bench_admission_host.py``).

**Deferred admission** (``prepare(defer_new_owners=True)``, eager EXTEND / MIXED forwards): that
O(prefix) pass is the canary's only host work that grows with a request's cached prefix, and it
would sit on the path to the request's first token. So for a row with a new owner the forward's
upload (before the pre launch) only resets what the device knows of the row: its owner chain to
:data:`UNKNOWN_OWNER_CHAIN` (the pre launch adopts the record's chain) and its known history
length to 0 (the pre launch skips the row's token checks). :meth:`RequestRows.prepare_deferred`
then reads the request's tokens while the device runs the model forward (the runner calls it
after enqueuing the model, before the post launch): the whole history, and the owner chain of
the prefix, which the admission launch (:mod:`sglang.jit_kernel.kv_canary.admission_owner`)
checks exactly as the pre launch would have (same violation row) before the post launch runs.
A row with no cached prefix and no token history kept (owner chains only) is not deferred: there
is nothing to read, its owner chain is the anchor (the chain of no tokens). The deferred
admissions' whole histories are handed to the caller (``RowUpdates.read_whole``), so the
write-input assert's expectations, built after the model is enqueued too, read the prompts
once. A deferred row without a cached prefix needs no admission check (its seed is the anchor).

An owner is the request object (held by weak reference and compared by identity: a new object
at a recycled address, or one equal by value, is a new owner) plus its retraction count and the
identities of its two token lists, so a retracted request, a request moved to another row, a
row reused by a new request, or a history that was replaced or shrank is re-sent in full.
:meth:`RequestRows.prepare` (at ``ForwardBatch.init_new``) packs everything one forward needs
into one host buffer (pinned on CUDA; with an :class:`~.upload_buffers.UploadBufferRing`, a
slice of one of its preallocated buffers); the bookkeeping advances only when
:meth:`RequestRows.commit` is called, when that buffer is uploaded, so a batch that never runs
leaves no gap.

**Steady batches.** Most forwards (decode steps) run the same requests, in the same rows and
order, as the forward committed before them, each with a few more output tokens. For such a
batch :meth:`RequestRows.prepare` reads what it needs with a few whole-batch passes (list
comprehensions and list comparisons) instead of the per-row loop: the requests (by identity),
their rows, retraction counts, token lists (the same objects, or equal ones) and prompt lengths
must be the committed batch's, and no output may be shorter; then each row's new output tokens
are sent. Anything else (a row whose owner changed, a history that shrank, another batch)
takes the general path. Both give the same upload (tested over a simulated schedule). A steady
decode step (one new token per row) packed into an upload ring, the step a server repeats most,
writes the same bytes with the layout's constant parts (segment sizes, offsets) made once per
batch size, and publishes the ring's cached views (:meth:`RequestRows._pack_unit_step`).

Assumption: while a request owns a row its history only grows at the end, or is replaced or
shortened as above (SGLang 0.5.12 edits a token in place only in
``Req._check_vocab_boundary_finish``, on the token just appended, before any snapshot sees it).
"""

from __future__ import annotations

import itertools
import operator
import struct
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from sglang.jit_kernel.kv_canary.hashing import chain_after_numpy
from sglang.srt.kv_canary.runner.upload_buffers import UploadBuffer, UploadBufferRing

UNKNOWN_OWNER_CHAIN = 0  # "the host does not know": the device adopts the record's chain
UPLOAD_HEADER_WORDS = 1  # the packed upload's header: the unit-append row count (RowUpdates)
_NO_TOKENS = np.empty((0,), dtype=np.int64)


class RequestHistory(Protocol):
    """What the bookkeeping reads of SGLang's ``Req`` (``managers/schedule_batch.py``)."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int]
    req_pool_idx: int | None
    retraction_count: int


# (request, its retraction count, id of its origin_input_ids list, id of its output_ids list)
_OwnerKey = tuple["weakref.ref[Any]", int, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenHistorySection:
    """The token-history part of one forward's upload (views of the packed host buffer).

    ``req_all_ids_lens[b]`` is row ``b``'s whole known history length and
    ``req_all_ids_flat[offsets[b]:offsets[b + 1]]`` the history's last tokens (all of them for a
    row with a new owner).
    """

    req_pool_indices: torch.Tensor  # int64 [bs]
    req_all_ids_lens: torch.Tensor  # int64 [bs]
    offsets: torch.Tensor  # int64 [bs + 1]
    req_all_ids_flat: torch.Tensor  # int64 [T]


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerSection:
    """The owner-chain part of one forward's upload: ``owner_chains[rows[k]] = values[k]``."""

    rows: torch.Tensor  # int64 [k]
    values: torch.Tensor  # int64 [k]


@dataclass(frozen=True, slots=True, kw_only=True)
class SeqLensSection:
    """The scheduler's host mirror of each row's ``seq_lens`` (the seq_lens invariant)."""

    values: torch.Tensor  # int64 [bs]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSection:
    """The deferred admissions' owner checks: row ``rows[k]`` with prefix ``prefix_lens[k]``
    must continue ``chains[k]`` (see :mod:`sglang.jit_kernel.kv_canary.admission_owner`)."""

    rows: torch.Tensor  # int64 [k]
    prefix_lens: torch.Tensor  # int64 [k]
    chains: torch.Tensor  # int64 [k]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeferredAdmission:
    """A row whose new owner's history and owner chain are sent after the model is enqueued
    (``prefix_len``: tokens cached before this forward; ``writes``: whether it writes any)."""

    row: int
    request: RequestHistory
    owner: _OwnerKey
    prefix_len: int
    writes: bool


@dataclass(slots=True, kw_only=True)
class RowUpdates:
    """Everything one forward uploads, packed in ``packed`` (one host-to-device copy), and the
    admissions whose tokens are read and sent later (:meth:`RequestRows.prepare_deferred`).

    Read-only once built, but not a frozen dataclass: one is built per forward, on the decode
    step's host path, where a frozen dataclass's field-by-field ``object.__setattr__`` would cost
    about 2.3 µs (measured on the development machine, 0.8 µs unfrozen).

    ``packed`` holds the sections back to back, in this order: the header (one word, the
    unit-append count below), the seq_lens mirror, then (when present) the token history's rows,
    lengths, offsets and tokens, the owner rows and values, and the admissions' rows, prefix
    lengths and chains; ``segment_sizes`` is the word count of each piece present.
    :meth:`sections_on` cuts any copy of ``packed`` into the sections with one
    ``split_with_sizes``; the ``seq_lens`` / ``token_history`` / ``owners`` / ``admissions``
    properties are the same sections of the host buffer (for inspection).

    **Unit append.** When every row's history segment is one token (a decode step) and the
    seq_lens section has a word per row, the header holds the row count ``bs`` and
    ``unit_append`` is set: the token history is then updated by
    :mod:`sglang.jit_kernel.kv_canary.append_history`, which reads this layout from the device
    upload area (captured into decode graphs), instead of the scatter. Otherwise the header is 0.
    """

    packed: torch.Tensor  # int64, CPU (pinned on CUDA machines)
    segment_sizes: tuple[int, ...]
    has_history: bool
    has_owners: bool
    has_admissions: bool
    commit_rows: tuple[int, ...]
    commit_owners: tuple[_OwnerKey, ...]
    commit_history_lens: tuple[int, ...]
    unknown_owner_rows: int  # rows whose owner chain the host could not compute
    deferred: tuple[DeferredAdmission, ...] = ()
    # (row, whole history) of each deferred admission (``prepare_deferred``, token history on),
    # for the caller's own reads of the same tokens; not compared
    read_whole: tuple[tuple[int, np.ndarray], ...] = field(default=(), compare=False, repr=False)
    # the batch as the device knows it once these updates are committed (None: not steady)
    steady_after: _SteadyBatch | None = None
    upload_buffer: UploadBuffer | None = None  # where ``packed`` lives (a ring's slice)
    unit_append: bool = False  # the header holds the row count (see "Unit append")
    # no row's history changed: the device already holds these lengths and tokens, so the
    # history section needs no scatter (the first decode step after a prefill under SGLang's
    # overlap scheduler, prepared before the prefill's token reaches ``output_ids``)
    history_unchanged: bool = False
    owner_rows: int = 0  # rows of the owner section (0 without one)
    admission_rows: int = 0  # rows of the admission section (0 without one)
    _host_sections: tuple[Any, ...] | None = field(default=None, init=False, repr=False,
                                                   compare=False)
    _public_views: tuple[torch.Tensor, torch.Tensor] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def sections_on(self, device_packed: torch.Tensor) -> tuple[
        SeqLensSection, TokenHistorySection | None, OwnerSection | None, AdmissionSection | None
    ]:
        """The sections as views of ``device_packed`` (a copy of ``packed``, same length)."""
        parts = iter(device_packed.split_with_sizes(self.segment_sizes))
        next(parts)  # the header
        seq_lens = SeqLensSection(values=next(parts))
        history = owners = admissions = None
        if self.has_history:
            history = TokenHistorySection(
                req_pool_indices=next(parts), req_all_ids_lens=next(parts),
                offsets=next(parts), req_all_ids_flat=next(parts),
            )
        if self.has_owners:
            owners = OwnerSection(rows=next(parts), values=next(parts))
        if self.has_admissions:
            admissions = AdmissionSection(
                rows=next(parts), prefix_lens=next(parts), chains=next(parts)
            )
        return seq_lens, history, owners, admissions

    def _on_host(self) -> tuple[Any, ...]:
        if self._host_sections is None:  # cut once, on first use (same views every time)
            self._host_sections = self.sections_on(self.packed)
        return self._host_sections

    def history_tokens_and_lens(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(req_all_ids_flat, req_all_ids_lens)`` of the host buffer, or None without a token
        history: the two views the carrier publishes on the batch (two slices, not the whole
        cut; made once)."""
        if not self.has_history:
            return None
        if self._public_views is None:
            (flat_start, flat_words), (lens_start, lens_words) = self._history_view_bounds()
            packed = self.packed
            self._public_views = (
                packed[flat_start : flat_start + flat_words],
                packed[lens_start : lens_start + lens_words],
            )
        return self._public_views

    def _history_view_bounds(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(start, words)`` in ``packed`` of the history tokens and of the lengths."""
        sizes = self.segment_sizes
        lens_start = sizes[0] + sizes[1] + sizes[2]  # after the header, seq_lens and rows
        flat_start = lens_start + sizes[3] + sizes[4]  # after the lengths and offsets
        return (flat_start, sizes[5]), (lens_start, sizes[3])

    def _publish_ring_views(self, ring: UploadBufferRing) -> None:
        """Set the two public history views from ``ring``'s view cache (the same view objects
        while a decode batch repeats its sizes, instead of two new slices per step)."""
        (flat_start, flat_words), (lens_start, lens_words) = self._history_view_bounds()
        buffer = self.upload_buffer
        self._public_views = (
            ring.view(buffer, start=flat_start, words=flat_words),
            ring.view(buffer, start=lens_start, words=lens_words),
        )

    @property
    def seq_lens(self) -> SeqLensSection:
        return self._on_host()[0]

    @property
    def token_history(self) -> TokenHistorySection | None:
        return self._on_host()[1]

    @property
    def owners(self) -> OwnerSection | None:
        return self._on_host()[2]

    @property
    def admissions(self) -> AdmissionSection | None:
        return self._on_host()[3]


# what a steady batch compares per row, in one pass: (row, retractions, origin list, output list)
_steady_key = operator.attrgetter(
    "req_pool_idx", "retraction_count", "origin_input_ids", "output_ids"
)
_ORIGIN = operator.itemgetter(2)  # of a _steady_key
_OUTPUT = operator.itemgetter(3)  # of a _steady_key
_LAST = operator.itemgetter(-1)


@dataclass(slots=True, kw_only=True)
class _SteadyBatch:
    """A batch every row of which the device knows in full: its requests and their token lists
    (strong references, so no identity is recycled while it is kept), in row order, and per row
    what the next batch is compared with (see "Steady batches" in the module docstring).
    Read-only once built (one per decode step: not frozen, for the cost, as :class:`RowUpdates`)."""

    reqs: tuple[RequestHistory, ...]
    keys: list[tuple[int | None, int, list[int], list[int]]]  # _steady_key of each request
    rows: list[int | None]
    origin_lens: list[int]
    output_lens: list[int]
    history_lens: list[int]

    @classmethod
    def of(cls, reqs: Sequence[RequestHistory], *, skip: int) -> _SteadyBatch | None:
        """The snapshot of ``reqs`` as they are now (after their whole histories are sent);
        None when a prompt is shorter than ``skip`` (its output tokens would not all extend
        the history)."""
        keys = list(map(_steady_key, reqs))
        origin_lens = list(map(len, map(_ORIGIN, keys)))
        if skip and min(origin_lens) < skip:
            return None
        output_lens = list(map(len, map(_OUTPUT, keys)))
        history_lens = list(map(operator.add, origin_lens, output_lens))
        if skip:
            history_lens = [length - skip for length in history_lens]
        return cls(
            reqs=tuple(reqs), keys=keys, rows=[key[0] for key in keys], origin_lens=origin_lens,
            output_lens=output_lens, history_lens=history_lens,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _UnitStepLayout:
    """The constant parts of a steady decode step's upload for ``bs`` rows (see
    :meth:`RequestRows._pack_unit_step`)."""

    segment_sizes: tuple[int, ...]
    words: int
    offsets: list[int]  # the history offsets: one token per row
    # writes the layout's ``words`` int64 words at the start of a buffer: one C call, about a
    # third of the time numpy takes to assign a Python list of 64 rows' words
    writer: struct.Struct
    # the two public history views (RowUpdates.history_tokens_and_lens) of an upload in each
    # ring slot, made at the slot's first use: the same views every step
    ring_views: dict[int, tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def of(cls, *, bs: int, owner_chains: bool) -> _UnitStepLayout:
        sizes = _segment_sizes(seq_lens=bs, history=(bs, bs), owners=0 if owner_chains else None,
                               admissions=None)
        words = sum(sizes)
        return cls(segment_sizes=sizes, words=words, offsets=list(range(bs + 1)),
                   writer=struct.Struct(f"={words}q"), ring_views={})


def _segment_sizes(
    *, seq_lens: int, history: tuple[int, int] | None, owners: int | None,
    admissions: int | None,
) -> tuple[int, ...]:
    """The word count of each section of a packed upload, in :class:`RowUpdates`' order:
    the header, the seq_lens (``seq_lens`` words), then for each section present (not None)
    the token history's rows, lengths, offsets and tokens (``history``: rows, tokens), the
    owner rows and values (``owners`` rows), the admissions' rows, prefix lengths and chains
    (``admissions`` rows). The one place that order is written for the host."""
    sizes = [UPLOAD_HEADER_WORDS, seq_lens]
    if history is not None:
        rows, tokens = history
        sizes += (rows, rows, rows + 1, tokens)
    if owners is not None:
        sizes += (owners,) * 2
    if admissions is not None:
        sizes += (admissions,) * 3
    return tuple(sizes)


class RequestRows:
    """Per-row owners of one ``req_to_token`` pool and what the device knows of them.

    Args:
        num_rows: rows of ``req_to_token`` (padding row 0 included).
        token_history: keep the token history (send the tokens the device lacks).
        owner_chains: keep the owner chains (send the chain of rows with a new owner).
        pin_memory: pin the packed host buffers (CUDA).
        upload_buffers: take the packed host buffers from this ring (else one allocation per
            pack).
        incremental: send only what the device lacks (False: every history in full every
            forward, and every row's owner chain; the simple reference for tests).
        history_offset: the request tokens the row's history skips at its start: 0 for a
            target model, 1 for an EAGLE draft model, whose slot at position ``p`` holds the
            K/V of the token at ``p + 1`` (its history and owner chains are those of
            ``(origin_input_ids + output_ids)[1:]``).
    """

    def __init__(
        self,
        *,
        num_rows: int,
        token_history: bool,
        owner_chains: bool,
        pin_memory: bool,
        incremental: bool = True,
        history_offset: int = 0,
        upload_buffers: UploadBufferRing | None = None,
    ) -> None:
        if num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        if history_offset not in (0, 1):
            raise ValueError(f"history_offset must be 0 or 1, got {history_offset}")
        self.history_offset = history_offset
        self.keeps_token_history = token_history
        self.keeps_owner_chains = owner_chains
        self._pin_memory = pin_memory
        self._upload_buffers = upload_buffers
        self._incremental = incremental
        self._row_owner: list[_OwnerKey | None] = [None] * num_rows
        # history length the device knows per row (behind the steady snapshot, when one is
        # committed: see _materialize_steady)
        self._row_synced_len: list[int] = [0] * num_rows
        # the committed batch, when the device knows every row of it in full
        self._steady: _SteadyBatch | None = None
        self._unit_layouts: dict[int, _UnitStepLayout] = {}  # by batch size
        self._steady_batches = incremental  # False: always the general path (tests compare)

    def prepare(
        self,
        *,
        reqs: Sequence[RequestHistory],
        prefix_lens: Sequence[int] | Callable[[], Sequence[int]],
        seq_lens: Sequence[int],
        defer_new_owners: bool = False,
    ) -> RowUpdates:
        """Pack what one forward over ``reqs`` must upload (host only, never touches a device).

        Args:
            reqs: the forward's requests, one per batch row (``ModelWorkerBatch.reqs``).
            prefix_lens: tokens already in the KV cache for each row before this forward, or a
                function returning them (called only when a steady batch does not need them).
            seq_lens: the scheduler's host ``seq_lens`` of each row (``seq_lens_cpu``).
            defer_new_owners: leave the tokens and chains of rows with a new owner to
                :meth:`prepare_deferred` (see the module docstring; incremental mode only, and
                only for a forward whose post launch runs eagerly after the caller can send them),
                except a row without a cached prefix that has nothing to read (no token
                history).
        Raises:
            ValueError: a request has no ``req_pool_idx``, or the lengths differ.
        """
        if len(seq_lens) != len(reqs):
            raise ValueError(f"{len(reqs)} requests but {len(seq_lens)} seq_lens")
        steady = self._prepare_steady(reqs=reqs, seq_lens=seq_lens)
        if steady is not None:
            return steady
        if callable(prefix_lens):
            prefix_lens = prefix_lens()
        if len(prefix_lens) != len(reqs):
            raise ValueError(f"{len(reqs)} requests but {len(prefix_lens)} prefix lengths")
        self._materialize_steady()
        rows: list[int] = []
        owners: list[_OwnerKey] = []
        history_lens: list[int] = []
        segment_lens: list[int] = []
        # the history tokens to send, in row order: whole histories of new owners as arrays
        # (converted once, also for the owner chain), the short tails of the others as one list
        history_chunks: list[list[int] | np.ndarray] = []
        tails: list[int] = []
        owner_rows: list[int] = []
        owner_values: list[int] = []
        deferred: list[DeferredAdmission] = []
        unknown = 0
        history_changed = False  # any row whose history (or known length) this upload changes
        defer = defer_new_owners and self._incremental
        # a row with no cached prefix is not deferred when nothing would be read later
        undefer_fresh = defer and not self.keeps_token_history
        incremental = self._incremental
        skip = self.history_offset
        keeps_history = self.keeps_token_history
        keeps_chains = self.keeps_owner_chains
        row_owner = self._row_owner
        row_synced_len = self._row_synced_len
        for req, prefix_len, seq_len in zip(reqs, prefix_lens, seq_lens):
            row = req.req_pool_idx
            if row is None:
                raise ValueError(
                    f"request {req.rid!r} is in a forward batch but has req_pool_idx=None; "
                    "the canary needs its req_to_token row"
                )
            origin, output = req.origin_input_ids, req.output_ids
            owner = row_owner[row]
            # the same owner: the same object (by identity), retraction count and token lists
            new_owner = not (
                incremental and owner is not None and owner[0]() is req
                and owner[1] == req.retraction_count
                and owner[2] == id(origin) and owner[3] == id(output)
            )
            if new_owner:
                owner = (weakref.ref(req), req.retraction_count, id(origin), id(output))
            rows.append(row)
            num_origin = len(origin)
            # the row's history is the request's tokens from index `skip` on
            history_len = max(num_origin + len(output) - skip, 0)
            if defer and new_owner and not (undefer_fresh and prefix_len == 0):
                # the device forgets the row's previous owner now; its own tokens come later
                deferred.append(DeferredAdmission(
                    row=row, request=req, owner=owner, prefix_len=int(prefix_len),
                    writes=seq_len > prefix_len,
                ))
                history_lens.append(0)
                segment_lens.append(0)
                history_changed = True
                if keeps_chains:
                    owner_rows.append(row)
                    owner_values.append(UNKNOWN_OWNER_CHAIN)
                continue
            owners.append(owner)
            history_lens.append(history_len)
            whole_history: np.ndarray | None = None
            if keeps_history:
                start = 0 if new_owner else row_synced_len[row]
                history_changed = history_changed or new_owner or start != history_len
                if start > history_len:  # the history shrank in place: rewrite it
                    start = 0
                first = start + skip  # index of the first token to send in origin + output
                if start == 0:
                    whole_history = _history_array(origin, output, history_len, skip=skip)
                    if tails:
                        history_chunks.append(tails)
                        tails = []
                    history_chunks.append(whole_history)
                elif first >= num_origin:
                    tails += output[first - num_origin :]
                else:
                    tails += origin[first:]
                    tails += output
                segment_lens.append(history_len - start)
            if keeps_chains and new_owner:
                owner_rows.append(row)
                if prefix_len > history_len:
                    owner_values.append(UNKNOWN_OWNER_CHAIN)
                    unknown += 1
                elif whole_history is not None:
                    owner_values.append(chain_after_numpy(whole_history[:prefix_len]))
                else:  # (no cached prefix: the chain of no tokens, nothing to read)
                    owner_values.append(chain_after_numpy(
                        _history_array(origin, output, prefix_len, skip=skip)
                        if prefix_len > 0 else _NO_TOKENS
                    ))
        if tails:
            history_chunks.append(tails)
        deferred_rows = {admission.row for admission in deferred}
        committed = [
            index for index, row in enumerate(rows) if row not in deferred_rows
        ] if deferred else range(len(rows))
        return _pack(
            pin_memory=self._pin_memory,
            upload_buffers=self._upload_buffers,
            seq_lens=seq_lens,
            history=(rows, history_lens, segment_lens, history_chunks)
            if self.keeps_token_history
            else None,
            owners=(owner_rows, owner_values) if self.keeps_owner_chains else None,
            commit_rows=tuple(rows[index] for index in committed),
            commit_owners=tuple(owners),
            commit_history_lens=tuple(history_lens[index] for index in committed),
            unknown_owner_rows=unknown,
            deferred=tuple(deferred),
            steady_after=_SteadyBatch.of(reqs, skip=skip)
            if self._steady_batches and not deferred and reqs
            else None,
            history_unchanged=incremental and not history_changed,
        )

    def _materialize_steady(self) -> None:
        """Write the committed steady batch's known lengths into the per-row bookkeeping
        (steady commits leave them in the snapshot; the general path reads them per row)."""
        steady = self._steady
        if steady is not None:
            synced = self._row_synced_len
            for row, history_len in zip(steady.rows, steady.history_lens):
                synced[row] = history_len

    def _prepare_steady(
        self, *, reqs: Sequence[RequestHistory], seq_lens: Sequence[int]
    ) -> RowUpdates | None:
        """:meth:`prepare` of a steady batch (module docstring), or None when it is not one:
        the same requests as the committed batch, in the same rows and order, with the same
        retraction counts and token lists (or equal ones), origins of the same lengths and no
        output shorter."""
        steady = self._steady
        if steady is None or len(reqs) != len(steady.reqs) or not all(
            map(operator.is_, reqs, steady.reqs)
        ):
            return None
        # one comparison of (row, retractions, origin, output) per row: identical token lists
        # compare equal without a call; a replaced list equal to the old one is as good (the
        # device holds the same tokens)
        keys = list(map(_steady_key, reqs))
        if keys != steady.keys or list(map(len, map(_ORIGIN, keys))) != steady.origin_lens:
            return None
        outputs = list(map(_OUTPUT, keys))
        output_lens = list(map(len, outputs))
        added = list(map(operator.sub, output_lens, steady.output_lens))
        unit_segments = added.count(1) == len(added)  # a decode step
        if not unit_segments and min(added) < 0:  # a history shrank: the general path rewrites
            return None
        history_lens = list(map(operator.add, steady.history_lens, added))
        rows = steady.rows
        steady_after = _SteadyBatch(
            reqs=steady.reqs, keys=steady.keys, rows=rows, origin_lens=steady.origin_lens,
            output_lens=output_lens, history_lens=history_lens,
        )
        if (unit_segments and self.keeps_token_history and self._upload_buffers is not None
                and len(seq_lens) == len(rows)):
            return self._pack_unit_step(
                seq_lens=seq_lens, rows=rows, history_lens=history_lens,
                tokens=list(map(_LAST, outputs)), steady_after=steady_after,
            )
        history = None
        unchanged = not unit_segments and max(added, default=0) == 0
        if self.keeps_token_history:
            if unit_segments:
                tokens: list[int] = list(map(_LAST, outputs))
            else:
                tokens = [
                    token for output, start in zip(outputs, steady.output_lens)
                    for token in output[start:]
                ]
            history = (rows, history_lens, added, [tokens])
        # committing it moves nothing per row: the rows' known lengths live in the snapshot
        # until the general path takes over (_materialize_steady)
        return _pack(
            pin_memory=self._pin_memory,
            upload_buffers=self._upload_buffers,
            seq_lens=seq_lens,
            history=history,
            owners=([], []) if self.keeps_owner_chains else None,
            commit_rows=(),
            commit_owners=(),
            commit_history_lens=(),
            unknown_owner_rows=0,
            unit_segments=unit_segments,
            steady_after=steady_after,
            history_unchanged=unchanged,
        )

    def _pack_unit_step(
        self, *, seq_lens: Sequence[int], rows: list[int], history_lens: list[int],
        tokens: list[int], steady_after: _SteadyBatch,
    ) -> RowUpdates:
        """What :func:`_pack` makes of a steady decode step (one new token per row, a seq_lens
        word per row, an upload ring), with the layout's constant parts made once per batch
        size: the same bytes and sections, in fewer host steps."""
        bs = len(rows)
        layout = self._unit_layouts.get(bs)
        if layout is None:
            layout = self._unit_layouts[bs] = _UnitStepLayout.of(
                bs=bs, owner_chains=self.keeps_owner_chains
            )
        ring = self._upload_buffers
        buffer = ring.take(layout.words)
        layout.writer.pack_into(
            buffer.array, 0, bs, *seq_lens, *rows, *history_lens, *layout.offsets, *tokens
        )
        updates = RowUpdates(
            packed=buffer.tensor, segment_sizes=layout.segment_sizes, has_history=True,
            has_owners=self.keeps_owner_chains, has_admissions=False, commit_rows=(),
            commit_owners=(), commit_history_lens=(), unknown_owner_rows=0,
            steady_after=steady_after, upload_buffer=buffer, unit_append=True,
        )
        views = None if buffer.slot is None else layout.ring_views.get(buffer.slot)
        if views is None:
            updates._publish_ring_views(ring)
            if buffer.slot is not None:
                layout.ring_views[buffer.slot] = updates._public_views
        else:
            updates._public_views = views
        return updates

    def prepare_deferred(self, deferred: Sequence[DeferredAdmission]) -> RowUpdates:
        """Pack what the admissions :meth:`prepare` deferred need: each row's whole history
        (token history on) and the owner chain of its prefix (owner chains on, for a row that
        writes this forward; none when the request has fewer tokens than its prefix, which the
        device then keeps as adopted; none for a row without a cached prefix, whose seed is the
        anchor). Reads each request's token lists once (token history on: handed over in
        ``read_whole``); host only. Commit it once uploaded."""
        rows: list[int] = []
        history_lens: list[int] = []
        chunks: list[list[int] | np.ndarray] = []
        checks: tuple[list[int], list[int], list[int]] = ([], [], [])
        unknown = 0
        for admission in deferred:
            origin = admission.request.origin_input_ids
            output = admission.request.output_ids
            history_len = max(len(origin) + len(output) - self.history_offset, 0)
            read = history_len if self.keeps_token_history else min(
                admission.prefix_len, history_len
            )
            tokens = _history_array(origin, output, read, skip=self.history_offset)
            rows.append(admission.row)
            history_lens.append(history_len)
            chunks.append(tokens)
            if not (self.keeps_owner_chains and admission.writes) or admission.prefix_len == 0:
                continue
            if admission.prefix_len > history_len:
                unknown += 1
                continue
            checks[0].append(admission.row)
            checks[1].append(admission.prefix_len)
            checks[2].append(chain_after_numpy(tokens[: admission.prefix_len]))
        return _pack(
            pin_memory=self._pin_memory,
            upload_buffers=self._upload_buffers,
            seq_lens=(),
            history=(rows, history_lens, [len(chunk) for chunk in chunks], chunks)
            if self.keeps_token_history
            else None,
            owners=None,
            admissions=checks if self.keeps_owner_chains else None,
            commit_rows=tuple(rows),
            commit_owners=tuple(admission.owner for admission in deferred),
            commit_history_lens=tuple(history_lens),
            unknown_owner_rows=unknown,
            read_whole=tuple(zip(rows, chunks)) if self.keeps_token_history else (),
        )

    def commit(self, updates: RowUpdates) -> None:
        """The updates were uploaded: the device now knows what they carried (a deferred
        admission's row keeps its previous owner until its own update is committed)."""
        self._steady = updates.steady_after
        if not updates.commit_rows:  # a steady batch: the snapshot holds what changed
            return
        for row, owner, history_len in zip(
            updates.commit_rows, updates.commit_owners, updates.commit_history_lens
        ):
            self._row_owner[row] = owner
            self._row_synced_len[row] = history_len


def _history_array(
    origin: list[int], output: list[int], length: int, *, skip: int = 0
) -> np.ndarray:
    """``(origin + output)[skip : skip + length]`` as an int64 array (the one O(length) pass
    over the request's Python lists)."""
    end = skip + length
    from_origin = max(min(end, len(origin)) - skip, 0)
    head = np.fromiter(
        origin if skip == 0 else itertools.islice(origin, skip, None),
        dtype=np.int64, count=from_origin,
    )
    if from_origin == length:
        return head
    output_start = max(skip - len(origin), 0)
    rest = np.fromiter(
        output if output_start == 0 else itertools.islice(output, output_start, None),
        dtype=np.int64, count=length - from_origin,
    )
    return rest if from_origin == 0 else np.concatenate((head, rest))


def _pack(
    *,
    pin_memory: bool,
    upload_buffers: UploadBufferRing | None,
    seq_lens: Sequence[int],
    history: tuple[list[int], list[int], list[int], list[list[int] | np.ndarray]] | None,
    owners: tuple[list[int], list[int]] | None,
    commit_rows: tuple[int, ...],
    admissions: tuple[list[int], list[int], list[int]] | None = None,
    commit_owners: tuple[_OwnerKey, ...],
    commit_history_lens: tuple[int, ...],
    unknown_owner_rows: int,
    deferred: tuple[DeferredAdmission, ...] = (),
    read_whole: tuple[tuple[int, np.ndarray], ...] = (),
    steady_after: _SteadyBatch | None = None,
    unit_segments: bool = False,
    history_unchanged: bool = False,
) -> RowUpdates:
    """Lay the sections out back to back in one (pinned) int64 host buffer; host only.
    ``unit_segments``: every history segment is one token (a decode step's; checked here
    otherwise). ``history_unchanged``: the caller knows every row's history is what the device
    holds (see :attr:`RowUpdates.history_unchanged`)."""
    unit_append = False
    history_words = None
    if history is not None:
        rows, history_lens, segment_lens, chunks = history
        bs = len(rows)
        history_words = (bs, sum(segment_lens))
        if not unit_segments:
            unit_segments = segment_lens.count(1) == bs
        unit_append = unit_segments and bs > 0 and len(seq_lens) == bs
    sizes = _segment_sizes(
        seq_lens=len(seq_lens), history=history_words,
        owners=None if owners is None else len(owners[0]),
        admissions=None if admissions is None else len(admissions[0]),
    )
    if upload_buffers is None:
        buffer = None
        packed = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=pin_memory)
        array = packed.numpy()
    else:
        buffer = upload_buffers.take(sum(sizes))
        packed, array = buffer.tensor, buffer.array
    # The Python-list parts go into one list and the buffer with one assignment (each numpy
    # call costs more than a pass over a decode batch); numpy chunks (whole histories) are
    # assigned as they are.
    words: list[int] = [bs if unit_append else 0]
    words += seq_lens
    start = 0  # where ``words`` goes in ``array``
    if history is not None:
        words += rows
        words += history_lens
        words += range(bs + 1) if unit_segments else itertools.accumulate(segment_lens, initial=0)
        for chunk in chunks:
            if isinstance(chunk, np.ndarray):
                end = start + len(words)
                array[start:end] = words
                array[end : end + len(chunk)] = chunk
                start, words = end + len(chunk), []
            else:
                words += chunk
    for values in (owners or ()) + (admissions or ()):
        words += values
    array[start : start + len(words)] = words
    updates = RowUpdates(
        packed=packed,
        segment_sizes=sizes,
        has_history=history is not None,
        has_owners=owners is not None,
        has_admissions=admissions is not None,
        commit_rows=commit_rows,
        commit_owners=commit_owners,
        commit_history_lens=commit_history_lens,
        unknown_owner_rows=unknown_owner_rows,
        deferred=deferred,
        read_whole=read_whole,
        steady_after=steady_after,
        upload_buffer=buffer,
        unit_append=unit_append,
        history_unchanged=history_unchanged and history is not None,
        owner_rows=0 if owners is None else len(owners[0]),
        admission_rows=0 if admissions is None else len(admissions[0]),
    )
    if history is not None and buffer is not None:
        updates._publish_ring_views(upload_buffers)
    return updates
