"""Host bookkeeping of ``req_to_token`` rows: which request owns each row, and what the device
must be told when that changes.

Two device-side facts are kept per request row (see :mod:`.token_checks` and the kernels):

* the **token history** (verify-token, write-input assert): the request's
  ``origin_input_ids + output_ids``;
* the **owner chain** (ownership check): the chain value the row's next position must have,
  i.e. ``CHAIN_ANCHOR + sum(chain_term(t_q, q) for q < prefix_len)`` over the request's own
  tokens. The device advances it with every write of a row whose owner did not change.

The host touches a row only when it gets a **new owner**: a new request, a retracted request
admitted again, a request moved to another row, a row reused by another request, a history that
was replaced. Then it sends the whole history and the owner chain of the cached prefix, in
O(prefix) once per admission (one pass over the request's token lists into an int64 array,
shared with the token history when that is on). What the row learns after that comes from the
device itself: every sampled token is appended there (``history_tails=False``, the default), or,
for EAGLE, whose accepted tokens do not pass through ``ModelRunner.sample``, the host sends each
row's new tokens (``history_tails=True``; :attr:`RequestRows.history_tails`).

**Deferred admission** (``prepare(defer_new_owners=True)``, eager EXTEND / MIXED forwards): the
O(prefix) pass would sit on the path to the request's first token. So for a row with a new owner
the forward's upload (before the pre launch) only resets what the device knows of the row: its
owner chain to :data:`UNKNOWN_OWNER_CHAIN` (the pre launch adopts the record's chain) and its
known history length to 0 (the pre launch skips the row's token checks).
:meth:`RequestRows.prepare_deferred` then reads the request's tokens while the device runs the
model forward (the runner calls it after enqueuing the model, before the post launch): the whole
history, and the owner chain of the prefix, which the admission launch
(:mod:`sglang.jit_kernel.kv_canary.admission_owner`) checks exactly as the pre launch would have
(same violation row) before the post launch runs. A row with no cached prefix and no token
history kept (owner chains only) is not deferred: there is nothing to read, its owner chain is
the anchor. The deferred admissions' whole histories are handed to the caller
(``RowUpdates.read_whole``), so the write-input assert's expectations, built after the model is
enqueued too, read the prompts once.

An owner is the request object (held by weak reference and compared by identity: a new object
at a recycled address, or one equal by value, is a new owner) plus its retraction count and the
identities of its two token lists. :meth:`RequestRows.prepare` (at ``ForwardBatch.init_new``)
packs everything one forward needs into one host buffer (pinned on CUDA; with an
:class:`~.upload_buffers.UploadBufferRing`, a slice of one of its preallocated buffers); the
bookkeeping advances only when :meth:`RequestRows.commit` is called, when that buffer is
uploaded, so a batch that never runs leaves no gap.

Assumption: while a request owns a row its history only grows at the end, or its output list is
replaced (SGLang 0.5.12 edits a token in place only in ``Req._check_vocab_boundary_finish``, on
the token just appended, and the request finishes there).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from sglang.jit_kernel.kv_canary.hashing import chain_after_numpy
from sglang.srt.kv_canary.runner.upload_buffers import UploadBuffer, UploadBufferRing

UNKNOWN_OWNER_CHAIN = 0  # "the host does not know": the device adopts the record's chain
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
    """The token-history part of one forward's upload (views of the packed buffer).

    ``req_all_ids_lens[k]`` is row ``req_pool_indices[k]``'s whole known history length and
    ``req_all_ids_flat[offsets[k]:offsets[k + 1]]`` the history's last tokens (all of them for a
    row with a new owner).
    """

    req_pool_indices: torch.Tensor  # int64 [k]
    req_all_ids_lens: torch.Tensor  # int64 [k]
    offsets: torch.Tensor  # int64 [k + 1]
    req_all_ids_flat: torch.Tensor  # int64 [T]


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerSection:
    """The owner-chain part of one forward's upload: ``owner_chains[rows[k]] = values[k]``."""

    rows: torch.Tensor  # int64 [k]
    values: torch.Tensor  # int64 [k]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSection:
    """The deferred admissions' owner checks: row ``rows[k]`` with prefix ``prefix_lens[k]``
    must continue ``chains[k]`` (see :mod:`sglang.jit_kernel.kv_canary.admission_owner`)."""

    rows: torch.Tensor  # int64 [k]
    prefix_lens: torch.Tensor  # int64 [k]
    chains: torch.Tensor  # int64 [k]


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadSections:
    """The sections of one packed upload, cut from a copy of it (None: section absent)."""

    history: TokenHistorySection | None
    owners: OwnerSection | None
    admissions: AdmissionSection | None


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
    """Everything one forward uploads about its request rows, packed in ``packed`` (one
    host-to-device copy), and the admissions whose tokens are read and sent later
    (:meth:`RequestRows.prepare_deferred`).

    Read-only once built, but not a frozen dataclass: one is built per forward on the host path
    of every extend, where a frozen dataclass's field-by-field ``object.__setattr__`` costs about
    three times a plain one's construction.

    ``packed`` holds the sections back to back, in this order (when present): the token
    history's rows, lengths, offsets and tokens, the owner rows and values, and the admissions'
    rows, prefix lengths and chains; ``segment_sizes`` is the word count of each piece present.
    :meth:`sections_on` cuts any copy of ``packed`` into the sections with one
    ``split_with_sizes``.
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
    history_rows: int = 0  # rows of the history section (0 without one)
    owner_rows: int = 0  # rows of the owner section (0 without one)
    admission_rows: int = 0  # rows of the admission section (0 without one)
    deferred: tuple[DeferredAdmission, ...] = ()
    # (row, whole history) of each deferred admission (``prepare_deferred``, token history on),
    # for the caller's own reads of the same tokens; not compared
    read_whole: tuple[tuple[int, np.ndarray], ...] = field(default=(), compare=False, repr=False)
    upload_buffer: UploadBuffer | None = None  # where ``packed`` lives (a ring's slice)

    @property
    def empty(self) -> bool:
        """Nothing to upload: no section has a row."""
        return self.history_rows == 0 and self.owner_rows == 0 and self.admission_rows == 0

    def sections_on(self, device_packed: torch.Tensor) -> UploadSections:
        """The sections as views of ``device_packed`` (a copy of ``packed``, same length)."""
        parts = iter(device_packed.split_with_sizes(self.segment_sizes))
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
        return UploadSections(history=history, owners=owners, admissions=admissions)

    @property
    def host_sections(self) -> UploadSections:
        """The sections of the host buffer (for inspection and the carrier's public views)."""
        return self.sections_on(self.packed)

    def history_tokens_and_lens(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(req_all_ids_flat, req_all_ids_lens)`` of the host buffer, or None without a history
        section with rows: the views the carrier publishes on the batch."""
        if not self.has_history or self.history_rows == 0:
            return None
        history = self.host_sections.history
        return history.req_all_ids_flat, history.req_all_ids_lens


class RequestRows:
    """Per-row owners of one ``req_to_token`` pool and what the device knows of them.

    Args:
        num_rows: rows of ``req_to_token`` (padding row 0 included).
        token_history: keep the token history (send new owners' histories).
        owner_chains: keep the owner chains (send the chain of rows with a new owner).
        pin_memory: pin the packed host buffers (CUDA).
        history_tails: also send each row's new tokens every forward (EAGLE); otherwise the
            device appends the sampled tokens itself and a row's history is sent only with a
            new owner.
        upload_buffers: take the packed host buffers from this ring (else one allocation per
            pack).
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
        history_tails: bool = False,
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
        self.history_tails = history_tails
        self._pin_memory = pin_memory
        self._upload_buffers = upload_buffers
        self._row_owner: list[_OwnerKey | None] = [None] * num_rows
        # history length the device was sent per row (history_tails only)
        self._row_synced_len: list[int] = [0] * num_rows

    def prepare(
        self,
        *,
        reqs: Sequence[RequestHistory],
        prefix_lens: Sequence[int],
        seq_lens: Sequence[int],
        defer_new_owners: bool = False,
    ) -> RowUpdates:
        """Pack what one forward over ``reqs`` must upload (host only, never touches a device).

        Args:
            reqs: the forward's requests, one per batch row (``ModelWorkerBatch.reqs``).
            prefix_lens: tokens already in the KV cache for each row before this forward.
            seq_lens: the scheduler's host ``seq_lens`` of each row (``seq_lens_cpu``).
            defer_new_owners: leave the tokens and chains of rows with a new owner to
                :meth:`prepare_deferred` (see the module docstring; only for a forward whose
                post launch runs eagerly after the caller can send them), except a row without a
                cached prefix that has nothing to read (no token history).
        Raises:
            ValueError: a request has no ``req_pool_idx``, or the lengths differ.
        """
        if len(seq_lens) != len(reqs) or len(prefix_lens) != len(reqs):
            raise ValueError(
                f"{len(reqs)} requests but {len(seq_lens)} seq_lens and {len(prefix_lens)} "
                "prefix lengths"
            )
        history_rows: list[int] = []
        history_lens: list[int] = []
        segment_lens: list[int] = []
        # the history tokens to send, in row order: whole histories of new owners as arrays
        # (converted once, also for the owner chain), the short tails of the others as lists
        history_chunks: list[list[int] | np.ndarray] = []
        owner_rows: list[int] = []
        owner_values: list[int] = []
        commit_rows: list[int] = []
        commit_owners: list[_OwnerKey] = []
        commit_history_lens: list[int] = []
        deferred: list[DeferredAdmission] = []
        unknown = 0
        # a row with no cached prefix is not deferred when nothing would be read later
        undefer_fresh = defer_new_owners and not self.keeps_token_history
        skip = self.history_offset
        keeps_history = self.keeps_token_history
        keeps_chains = self.keeps_owner_chains
        tails = self.history_tails
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
                owner is not None and owner[0]() is req
                and owner[1] == req.retraction_count
                and owner[2] == id(origin) and owner[3] == id(output)
            )
            # the row's history is the request's tokens from index `skip` on
            history_len = max(len(origin) + len(output) - skip, 0)
            if not new_owner:
                if not (tails and keeps_history):
                    continue  # the device knows the row and learns its tokens itself
                start = row_synced_len[row]
                if start > history_len:  # the history shrank in place: rewrite it
                    start = 0
                if start == history_len:
                    continue
                history_rows.append(row)
                history_lens.append(history_len)
                segment_lens.append(history_len - start)
                history_chunks.append(_history_array(origin, output, history_len - start,
                                                     skip=skip + start))
                commit_rows.append(row)
                commit_owners.append(owner)
                commit_history_lens.append(history_len)
                continue
            owner = (weakref.ref(req), req.retraction_count, id(origin), id(output))
            if defer_new_owners and not (undefer_fresh and prefix_len == 0):
                # the device forgets the row's previous owner now; its own tokens come later
                deferred.append(DeferredAdmission(
                    row=row, request=req, owner=owner, prefix_len=int(prefix_len),
                    writes=seq_len > prefix_len,
                ))
                if keeps_history:
                    history_rows.append(row)
                    history_lens.append(0)
                    segment_lens.append(0)
                if keeps_chains:
                    owner_rows.append(row)
                    owner_values.append(UNKNOWN_OWNER_CHAIN)
                continue
            commit_rows.append(row)
            commit_owners.append(owner)
            commit_history_lens.append(history_len)
            whole_history = None
            if keeps_history:
                whole_history = _history_array(origin, output, history_len, skip=skip)
                history_rows.append(row)
                history_lens.append(history_len)
                segment_lens.append(history_len)
                history_chunks.append(whole_history)
            if keeps_chains:
                owner_rows.append(row)
                if prefix_len > history_len:
                    owner_values.append(UNKNOWN_OWNER_CHAIN)
                    unknown += 1
                elif whole_history is not None:
                    owner_values.append(chain_after_numpy(whole_history[:prefix_len]))
                else:  # (no token history kept: read the prefix alone)
                    owner_values.append(chain_after_numpy(
                        _history_array(origin, output, prefix_len, skip=skip)
                        if prefix_len > 0 else _NO_TOKENS
                    ))
        return _pack(
            pin_memory=self._pin_memory,
            upload_buffers=self._upload_buffers,
            history=(history_rows, history_lens, segment_lens, history_chunks)
            if keeps_history else None,
            owners=(owner_rows, owner_values) if keeps_chains else None,
            commit_rows=tuple(commit_rows),
            commit_owners=tuple(commit_owners),
            commit_history_lens=tuple(commit_history_lens),
            unknown_owner_rows=unknown,
            deferred=tuple(deferred),
        )

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


def _segment_sizes(
    *, history: tuple[int, int] | None, owners: int | None, admissions: int | None,
) -> tuple[int, ...]:
    """The word count of each section of a packed upload, in :class:`RowUpdates`' order: for
    each section present (not None) the token history's rows, lengths, offsets and tokens
    (``history``: rows, tokens), the owner rows and values (``owners`` rows), the admissions'
    rows, prefix lengths and chains (``admissions`` rows). The one place that order is written
    for the host."""
    sizes: list[int] = []
    if history is not None:
        rows, tokens = history
        sizes += (rows, rows, rows + 1, tokens)
    if owners is not None:
        sizes += (owners,) * 2
    if admissions is not None:
        sizes += (admissions,) * 3
    return tuple(sizes)


def _pack(
    *,
    pin_memory: bool,
    upload_buffers: UploadBufferRing | None,
    history: tuple[list[int], list[int], list[int], list[list[int] | np.ndarray]] | None,
    owners: tuple[list[int], list[int]] | None,
    commit_rows: tuple[int, ...],
    admissions: tuple[list[int], list[int], list[int]] | None = None,
    commit_owners: tuple[_OwnerKey, ...],
    commit_history_lens: tuple[int, ...],
    unknown_owner_rows: int,
    deferred: tuple[DeferredAdmission, ...] = (),
    read_whole: tuple[tuple[int, np.ndarray], ...] = (),
) -> RowUpdates:
    """Lay the sections out back to back in one (pinned) int64 host buffer; host only."""
    history_words = None
    if history is not None:
        rows, history_lens, segment_lens, chunks = history
        history_words = (len(rows), sum(segment_lens))
    sizes = _segment_sizes(
        history=history_words,
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
    # call costs more than a pass over a short list); numpy chunks (whole histories) are
    # assigned as they are.
    words: list[int] = []
    start = 0  # where ``words`` goes in ``array``
    if history is not None:
        words += rows
        words += history_lens
        words += itertools.accumulate(segment_lens, initial=0)
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
    return RowUpdates(
        packed=packed,
        segment_sizes=sizes,
        has_history=history is not None,
        has_owners=owners is not None,
        has_admissions=admissions is not None,
        commit_rows=commit_rows,
        commit_owners=commit_owners,
        commit_history_lens=commit_history_lens,
        unknown_owner_rows=unknown_owner_rows,
        history_rows=0 if history is None else len(history[0]),
        owner_rows=0 if owners is None else len(owners[0]),
        admission_rows=0 if admissions is None else len(admissions[0]),
        deferred=deferred,
        read_whole=read_whole,
        upload_buffer=buffer,
    )
