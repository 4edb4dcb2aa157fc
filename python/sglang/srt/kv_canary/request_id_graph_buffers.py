"""Graph-resident per-request ids for the decode and EAGLE-draft CUDA graph runners (SPEC §3).

Code captured into a CUDA graph that reads ``forward_batch.rids_int`` /
``bootstrap_room_ids_int`` (e.g. ``TokenOracleManager.fill_expected_inputs``) must read
*static* tensors, refreshed before every replay. Each runner gets one
:class:`GraphRequestIdBuffers` (``[max_bs]``; rids 0, rooms -1), allocated at its first capture:

* capture: the ForwardBatch the captured forward receives gets the views ``[:bs]``;
* replay: ``[:raw_bs]`` is copied from the live batch and ``[raw_bs:]`` reset to 0 / -1, so no
  id of an earlier replay survives in a padded row.

Hooks (oracle only):

* decode ``CudaGraphRunner``: AROUND ``capture_one_batch_size`` wraps the ``forward`` callable it
  is given so the capture batch carries the views; AFTER ``replay_prepare`` (which both
  ``replay`` and EAGLE's target-verify preparation call, on the stream SGLang fills its own
  graph inputs on) refreshes the buffers.
* ``EAGLEDraftCudaGraphRunner``: its captured function calls ``eagle_worker.draft_forward``
  (not the ``forward`` it is given), so AROUND ``capture_one_batch_size`` shadows that method on
  the worker instance for the duration of the capture; BEFORE ``replay`` refreshes the buffers.

The sampler needs none of this: sampling runs outside the graph on the live batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.kv_canary.request_ids import (
    RID_PAD_VALUE,
    ROOM_PAD_VALUE,
    request_ids_of,
    set_request_ids,
)

GRAPH_REQUEST_ID_BUFFERS_ATTR = "kv_canary_request_id_buffers"  # attribute of a graph runner


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphRequestIdBuffers:
    """Static id buffers of one graph runner.

    Attributes:
        rids_int: int64 ``[max_bs]``; padded rows hold 0.
        bootstrap_room_ids_int: int64 ``[max_bs]``; padded rows hold -1.
    """

    rids_int: torch.Tensor
    bootstrap_room_ids_int: torch.Tensor

    @classmethod
    def allocate(cls, *, max_bs: int, device: torch.device | str) -> GraphRequestIdBuffers:
        return cls(
            rids_int=torch.full((max_bs,), RID_PAD_VALUE, dtype=torch.int64, device=device),
            bootstrap_room_ids_int=torch.full(
                (max_bs,), ROOM_PAD_VALUE, dtype=torch.int64, device=device
            ),
        )

    @property
    def max_bs(self) -> int:
        return self.rids_int.shape[0]

    def attach_capture_views(self, *, forward_batch: Any) -> None:
        """Give the capture batch the views ``[:forward_batch.batch_size]``."""
        bs = forward_batch.batch_size
        set_request_ids(
            forward_batch,
            rids_int=self.rids_int[:bs],
            bootstrap_room_ids_int=self.bootstrap_room_ids_int[:bs],
        )

    def fill_from(self, *, forward_batch: Any) -> None:
        """Copy the live batch's ids into ``[:raw_bs]`` and reset ``[raw_bs:]`` (4 device ops).

        Raises:
            MissingRequestIdsError: the live batch has no ids.
            ValueError: the live batch has more rows than the buffers, or its id count differs
                from its batch size.
        """
        rids_int, rooms = request_ids_of(forward_batch)
        raw_bs = rids_int.shape[0]
        if raw_bs != forward_batch.batch_size or raw_bs > self.max_bs:
            raise ValueError(
                f"KV canary request ids: {raw_bs} ids for a replayed batch of "
                f"{forward_batch.batch_size} rows (graph buffers hold {self.max_bs})"
            )
        self.rids_int[:raw_bs].copy_(rids_int)
        self.rids_int[raw_bs:].fill_(RID_PAD_VALUE)
        self.bootstrap_room_ids_int[:raw_bs].copy_(rooms)
        self.bootstrap_room_ids_int[raw_bs:].fill_(ROOM_PAD_VALUE)


def _buffers_of(runner: Any) -> GraphRequestIdBuffers:
    """The runner's buffers, allocated on first use (its first capture)."""
    buffers = getattr(runner, GRAPH_REQUEST_ID_BUFFERS_ATTR, None)
    if buffers is None:
        buffers = GraphRequestIdBuffers.allocate(
            max_bs=runner.max_bs, device=runner.model_runner.device
        )
        setattr(runner, GRAPH_REQUEST_ID_BUFFERS_ATTR, buffers)
    return buffers


def _captured_buffers_of(runner: Any) -> GraphRequestIdBuffers:
    buffers = getattr(runner, GRAPH_REQUEST_ID_BUFFERS_ATTR, None)
    if buffers is None:
        raise RuntimeError(
            f"KV canary request ids: {type(runner).__name__} replays a graph that was captured "
            "without the request-id buffers (its capture did not go through the hooked "
            "capture_one_batch_size)"
        )
    return buffers


def capture_decode_graph_with_request_ids(
    original: Callable[..., Any], runner: Any, bs: int, forward: Callable[..., Any],
    *args: Any, **kwargs: Any,
) -> Any:
    """AROUND ``CudaGraphRunner.capture_one_batch_size(bs, forward, stream_idx=None)``."""
    buffers = _buffers_of(runner)

    @functools.wraps(forward)  # keeps inspect.signature(forward), which the runner inspects
    def forward_with_request_ids(
        input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, **forward_kwargs: Any
    ) -> Any:
        buffers.attach_capture_views(forward_batch=forward_batch)
        return forward(input_ids, positions, forward_batch, **forward_kwargs)

    return original(runner, bs, forward_with_request_ids, *args, **kwargs)


def fill_decode_graph_request_ids_after_replay_prepare(
    result: None, runner: Any, forward_batch: Any, *args: Any, **kwargs: Any
) -> None:
    """AFTER ``CudaGraphRunner.replay_prepare(forward_batch, pp_proxy_tensors=None)``."""
    _captured_buffers_of(runner).fill_from(forward_batch=forward_batch)


_MISSING = object()


def capture_draft_graph_with_request_ids(
    original: Callable[..., Any], runner: Any, num_seqs: int, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``EAGLEDraftCudaGraphRunner.capture_one_batch_size(num_seqs, forward, ...)``."""
    buffers = _buffers_of(runner)
    worker = runner.eagle_worker
    draft_forward = worker.draft_forward
    shadowed = vars(worker).get("draft_forward", _MISSING)

    def draft_forward_with_request_ids(forward_batch: Any) -> Any:
        buffers.attach_capture_views(forward_batch=forward_batch)
        return draft_forward(forward_batch)

    worker.draft_forward = draft_forward_with_request_ids
    try:
        return original(runner, num_seqs, *args, **kwargs)
    finally:
        if shadowed is _MISSING:
            del worker.draft_forward
        else:
            worker.draft_forward = shadowed


def fill_draft_graph_request_ids_before_replay(
    runner: Any, forward_batch: Any, *args: Any, **kwargs: Any
) -> None:
    """BEFORE ``EAGLEDraftCudaGraphRunner.replay(forward_batch)``."""
    _captured_buffers_of(runner).fill_from(forward_batch=forward_batch)
