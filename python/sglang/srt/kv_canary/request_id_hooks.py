"""Hooks that give every ForwardBatch its per-request ids (SPEC §3); oracle only.

* AFTER ``ForwardBatch.init_new``: ``rids_int`` / ``bootstrap_room_ids_int`` from
  ``batch.reqs`` (one host-to-device copy), set on the ForwardBatch and on its
  ``sampling_info``; the sampling info also gets the rows' rids and sampled positions (host
  side, for the next-token-swap log line).
* AFTER ``ForwardBatch._pad_inputs_to_size`` (DP-attention / attention-TP padding): pad the ids
  to the padded batch size with 0 (rids) and -1 (rooms) and keep ``sampling_info`` in sync.

Batches that SGLang rebuilds from dataclass fields (two-batch-overlap children) do not carry
the ids; readers raise :class:`~sglang.srt.kv_canary.request_ids.MissingRequestIdsError`.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.kv_canary.perturb.next_token_swap import SAMPLED_ROWS_ATTR, SampledRows
from sglang.srt.kv_canary.request_ids import (
    RID_PAD_VALUE,
    RIDS_INT_ATTR,
    ROOM_PAD_VALUE,
    request_ids_of,
    request_ids_to_tensors,
    set_request_ids,
)


def attach_request_ids_after_init_new(
    forward_batch: Any, forward_batch_class: type, batch: Any, model_runner: Any
) -> None:
    """AFTER ``ForwardBatch.init_new(batch, model_runner)``.

    Raises:
        ValueError: ``batch.reqs`` does not have one request per row.
    """
    reqs = batch.reqs
    if len(reqs) != forward_batch.batch_size:
        raise ValueError(
            f"KV canary request ids: the batch has {forward_batch.batch_size} rows but "
            f"{len(reqs)} requests"
        )
    rids_int, rooms = request_ids_to_tensors(
        rids=[req.rid for req in reqs],
        bootstrap_rooms=[req.bootstrap_room for req in reqs],
        device=model_runner.device,
    )
    set_request_ids(forward_batch, rids_int=rids_int, bootstrap_room_ids_int=rooms)
    sampling_info = forward_batch.sampling_info
    if sampling_info is not None:
        set_request_ids(sampling_info, rids_int=rids_int, bootstrap_room_ids_int=rooms)
        setattr(
            sampling_info,
            SAMPLED_ROWS_ATTR,
            SampledRows(rids=forward_batch.rids, next_positions=batch.seq_lens_cpu),
        )


def pad_request_ids_after_pad_inputs(
    result: None, forward_batch: Any, model_runner: Any, num_tokens: int, bs: int
) -> None:
    """AFTER ``ForwardBatch._pad_inputs_to_size(model_runner, num_tokens, bs)``.

    A batch without ids (a two-batch-overlap child) is left alone: its ``sampling_info`` is the
    parent's, whose ids must not change.

    Raises:
        ValueError: the batch has more id rows than ``bs``.
    """
    if getattr(forward_batch, RIDS_INT_ATTR, None) is None:
        return
    rids_int, rooms = request_ids_of(forward_batch)
    rows = rids_int.shape[0]
    if rows == bs:
        return
    if rows > bs:
        raise ValueError(f"KV canary request ids: cannot pad {rows} id rows down to {bs}")
    padded_rids = torch.cat([rids_int, rids_int.new_full((bs - rows,), RID_PAD_VALUE)])
    padded_rooms = torch.cat([rooms, rooms.new_full((bs - rows,), ROOM_PAD_VALUE)])
    set_request_ids(forward_batch, rids_int=padded_rids, bootstrap_room_ids_int=padded_rooms)
    if forward_batch.sampling_info is not None:
        set_request_ids(
            forward_batch.sampling_info, rids_int=padded_rids, bootstrap_room_ids_int=padded_rooms
        )
