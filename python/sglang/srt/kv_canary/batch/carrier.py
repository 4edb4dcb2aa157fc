"""The per-batch carrier: what the canary attaches to one ``ForwardBatch``.

One :class:`CanaryBatchInputs` is built by the ``ForwardBatch.init_new`` hook and set
under one attribute, :data:`ATTRIBUTE`, on the ``ForwardBatch`` and on its
``SamplingBatchInfo`` (the sampler and EAGLE verification only see the latter). It carries
everything the runner's later events need about the batch, plus the runner itself so that a hook
that only sees a batch finds its owner.

The request ids also stay readable under their public names (``rids_int``,
``bootstrap_room_ids_int`` on both objects), and the token-history snapshot under
``req_all_ids_flat`` / ``req_all_ids_lens`` on the ``ForwardBatch``: other code may read those
while the batch's forward runs (they are views of a host upload buffer that a later forward
reuses).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

ATTRIBUTE = "kv_canary"
# the request ids' public names on a ForwardBatch and its SamplingBatchInfo (SPEC §3)
RIDS_INT_ATTR = "rids_int"
BOOTSTRAP_ROOM_IDS_INT_ATTR = "bootstrap_room_ids_int"
REQ_ALL_IDS_FLAT_ATTR = "req_all_ids_flat"
REQ_ALL_IDS_LENS_ATTR = "req_all_ids_lens"


@dataclass(slots=True, kw_only=True)
class CanaryBatchInputs:
    """What one forward batch carries for the canary (every field optional by feature).

    Never changed once attached (:meth:`replace` makes a new one), but not a frozen dataclass:
    one is built per forward on the decode step's host path, where a frozen dataclass's
    field-by-field ``object.__setattr__`` costs about three times a plain one's construction.

    The fields the runner alone reads are typed ``object`` here: this module is the ground
    floor and imports nothing above it.

    Attributes:
        runner: the model runner's canary that built this (a
            :class:`~sglang.srt.kv_canary.runner.canary_runner.CanaryRunner`; hooks that see only
            a batch dispatch to it).
        rids_int / bootstrap_room_ids_int: int64 ``[rows]`` device tensors (token oracle).
        row_updates: the packed host updates of the batch's request rows
            (:class:`~sglang.srt.kv_canary.runner.request_rows.RowUpdates`: new owners' token
            histories and owner chains) to upload before the forward; None when the forward
            sends none (a decode step: the device already knows every row).
        sampled_rows: the rows' rids and sampled positions
            (:class:`~sglang.srt.kv_canary.perturb.next_token_swap.SampledRows`, for the
            next-token-swap log line; only when that fault is configured).
        extend_reqs: the batch's requests, one per row (``ModelWorkerBatch.reqs``), kept for an
            EXTEND / MIXED batch's write-input expectations, which the runner builds once the
            model is enqueued.
        request_owners: ``(req_pool_idx, rid)`` of each row as of ``init_new``, for the report
            file's forward history (only with the report file on, and only for a batch whose
            rows the runner packs: None for a plain decode step).
    """

    runner: object
    rids_int: torch.Tensor | None = None
    bootstrap_room_ids_int: torch.Tensor | None = None
    row_updates: object | None = None
    sampled_rows: object | None = None
    extend_reqs: Sequence[Any] | None = None
    request_owners: Sequence[tuple[int, str]] | None = None

    def replace(self, **changes: Any) -> CanaryBatchInputs:
        return dataclasses.replace(self, **changes)


def attach_batch_inputs(holder: Any, inputs: CanaryBatchInputs) -> None:
    """Set ``inputs`` on ``holder`` (a ForwardBatch) with its public views: the request ids and
    the token-history snapshot."""
    attach_sampling_inputs(holder, inputs)
    history = None if inputs.row_updates is None else inputs.row_updates.history_tokens_and_lens()
    if history is not None:
        setattr(holder, REQ_ALL_IDS_FLAT_ATTR, history[0])
        setattr(holder, REQ_ALL_IDS_LENS_ATTR, history[1])


def attach_sampling_inputs(holder: Any, inputs: CanaryBatchInputs) -> None:
    """Set ``inputs`` on ``holder`` (a SamplingBatchInfo) with the request ids under their public
    names: all the sampler and EAGLE verification read (the token-history snapshot is the
    ForwardBatch's only)."""
    setattr(holder, ATTRIBUTE, inputs)
    setattr(holder, RIDS_INT_ATTR, inputs.rids_int)
    setattr(holder, BOOTSTRAP_ROOM_IDS_INT_ATTR, inputs.bootstrap_room_ids_int)


def batch_inputs_of(holder: Any) -> CanaryBatchInputs | None:
    """The carrier of a ForwardBatch or SamplingBatchInfo, or None (built without init_new)."""
    inputs = getattr(holder, ATTRIBUTE, None)
    return inputs if isinstance(inputs, CanaryBatchInputs) else None


def carried_field(holder: Any, field: str, *, what: str, consequence: str = "") -> Any:
    """``field`` of ``holder``'s carrier, which the runner needs at this point.

    Args:
        what: the missing field in words, for the error ("request-row updates").
        consequence: appended to the error (what would go wrong without it).
    Raises:
        RuntimeError: ``holder`` has no carrier, or its ``field`` is None (the
            ``ForwardBatch.init_new`` hook did not run for the batch).
    """
    inputs = batch_inputs_of(holder)
    value = None if inputs is None else getattr(inputs, field)
    if value is None:
        raise RuntimeError(
            f"KV canary: this {type(holder).__name__} carries no {what}; the "
            f"ForwardBatch.init_new hook did not run for it{consequence}"
        )
    return value


def runner_of_batch(holder: Any) -> Any:
    """The runner whose ``init_new`` hook built ``holder``'s carrier.

    Raises:
        RuntimeError: ``holder`` has no carrier (it was not built by ``ForwardBatch.init_new``,
            e.g. a two-batch-overlap child): :func:`carried_field`'s error.
    """
    return carried_field(
        holder, "runner", what=f"'{ATTRIBUTE}' inputs",
        consequence=" (batches built another way, e.g. two-batch-overlap children, do not "
        "have them)",
    )
