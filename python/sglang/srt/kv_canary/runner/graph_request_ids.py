"""Graph-resident per-request ids (and the oracle's next tokens) of the CUDA graph runners
(decode, EAGLE draft) of one model runner's canary.

Code captured into a CUDA graph that reads a batch's request ids (the write-input assert's
oracle expectations) must read *static* tensors, refreshed before every replay. Each graph
runner gets one :class:`GraphRequestIdBuffers` (``[max_bs]``; rids 0, rooms -1), kept by
:class:`GraphRequestIds`:

* capture: the batch the captured forward receives carries the views ``[:bs]``;
* replay: ``[:raw_bs]`` is copied from the live batch and ``[raw_bs:]`` reset to 0 / -1, so no
  id of an earlier replay survives in a padded row (skipped when the live batch carries the same
  id tensors as the last fill: a decode batch keeps its requests for many steps);
* a decode graph also writes its rows' next oracle tokens into ``next_tokens``, offered to the
  sampler of the replayed batch (see :mod:`sglang.srt.kv_canary.token_oracle.graph_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.kv_canary.batch.carrier import (
    CanaryBatchInputs,
    attach_batch_inputs,
    batch_inputs_of,
)
from sglang.srt.kv_canary.token_oracle.graph_tokens import GraphOracleTokens
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.token_oracle.request_ids import (
    RID_PAD_VALUE,
    ROOM_PAD_VALUE,
    request_ids_of,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphRequestIdBuffers:
    """Static id buffers of one graph runner.

    Attributes:
        rids_int: int64 ``[max_bs]``; padded rows hold 0.
        bootstrap_room_ids_int: int64 ``[max_bs]``; padded rows hold -1.
        next_tokens: int32 ``[max_bs]``, written inside a decode graph (the oracle's token
            after each row's position); unused by other graphs.
    """

    rids_int: torch.Tensor
    bootstrap_room_ids_int: torch.Tensor
    next_tokens: torch.Tensor

    @classmethod
    def allocate(cls, *, max_bs: int, device: torch.device | str) -> GraphRequestIdBuffers:
        with torch.inference_mode(False):
            return cls(
                rids_int=torch.full((max_bs,), RID_PAD_VALUE, dtype=torch.int64, device=device),
                bootstrap_room_ids_int=torch.full(
                    (max_bs,), ROOM_PAD_VALUE, dtype=torch.int64, device=device
                ),
                next_tokens=torch.zeros((max_bs,), dtype=torch.int32, device=device),
            )

    @property
    def max_bs(self) -> int:
        return self.rids_int.shape[0]

    def capture_views(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The views ``[:bs]`` a capture batch of ``bs`` rows reads."""
        return self.rids_int[:bs], self.bootstrap_room_ids_int[:bs]

    def fill(self, *, rids_int: torch.Tensor, bootstrap_room_ids_int: torch.Tensor) -> None:
        """Copy a live batch's ids into ``[:raw_bs]`` and reset ``[raw_bs:]`` (4 device ops).

        Raises:
            ValueError: the live batch has more rows than the buffers.
        """
        raw_bs = rids_int.shape[0]
        if raw_bs > self.max_bs or bootstrap_room_ids_int.shape[0] != raw_bs:
            raise ValueError(
                f"KV canary request ids: {raw_bs} rids and {bootstrap_room_ids_int.shape[0]} "
                f"rooms for a replayed batch (graph buffers hold {self.max_bs})"
            )
        self.rids_int[:raw_bs].copy_(rids_int)
        self.rids_int[raw_bs:].fill_(RID_PAD_VALUE)
        self.bootstrap_room_ids_int[:raw_bs].copy_(bootstrap_room_ids_int)
        self.bootstrap_room_ids_int[raw_bs:].fill_(ROOM_PAD_VALUE)


def samples_decode_tokens(forward_batch: Any) -> bool:
    """Whether a captured batch is a plain decode step, whose rows' next tokens come from the
    sampler (a target-verify graph's tokens are chosen by the EAGLE verify instead)."""
    return (forward_batch.forward_mode == ForwardMode.DECODE
            and getattr(forward_batch, "spec_info", None) is None)


class GraphRequestIds:
    """The graph-resident ids of every graph runner of one canary (see the module docstring).

    Args:
        oracle: the runner's oracle manager (decode graphs compute their next tokens with it).
        owner: the runner's canary (the carrier a capture batch gets names it).
        device: where the buffers live.
    """

    def __init__(self, *, oracle: TokenOracleManager, owner: object,
                 device: torch.device) -> None:
        self._oracle = oracle
        self._owner = owner
        self._device = device
        self._buffers: dict[int, GraphRequestIdBuffers] = {}
        # per graph runner: the id tensors its buffers were last filled from
        self._sources: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # the graph runners whose graphs compute their rows' next oracle tokens (decode graphs)
        self._token_graph_runners: set[int] = set()
        self.graph_tokens = GraphOracleTokens()

    @property
    def device_bytes(self) -> int:
        """Bytes of every buffer allocated so far."""
        return sum(
            t.numel() * t.element_size()
            for b in self._buffers.values()
            for t in (b.rids_int, b.bootstrap_room_ids_int, b.next_tokens)
        )

    def buffers_for(self, graph_runner: Any) -> GraphRequestIdBuffers:
        """The buffers of ``graph_runner`` (allocated at its first capture)."""
        buffers = self._buffers.get(id(graph_runner))
        if buffers is None:
            buffers = GraphRequestIdBuffers.allocate(max_bs=graph_runner.max_bs,
                                                     device=self._device)
            self._buffers[id(graph_runner)] = buffers
        return buffers

    def attach_capture_ids(self, *, forward_batch: Any, buffers: GraphRequestIdBuffers) -> None:
        """Give a capture batch the buffers' ``[:bs]`` views as its request ids."""
        rids_int, rooms = buffers.capture_views(forward_batch.batch_size)
        inputs = batch_inputs_of(forward_batch) or CanaryBatchInputs(runner=self._owner)
        attach_batch_inputs(
            forward_batch, inputs.replace(rids_int=rids_int, bootstrap_room_ids_int=rooms)
        )

    def capture_next_tokens(self, *, graph_runner: Any, forward_batch: Any,
                            positions: torch.Tensor, bs: int) -> None:
        """Inside a decode graph's capture: compute its rows' next oracle tokens into the
        graph-resident ``next_tokens`` (a plain decode step only)."""
        if not samples_decode_tokens(forward_batch):
            return
        buffers = self.buffers_for(graph_runner)
        rids_int, rooms = buffers.capture_views(bs)
        self._oracle.write_next_tokens_by_request(
            rids_int=rids_int, bootstrap_room_ids_int=rooms,
            logits_positions=positions[:bs], tokens_out=buffers.next_tokens[:bs],
        )
        self._token_graph_runners.add(id(graph_runner))

    def fill(self, *, graph_runner: Any, forward_batch: Any) -> None:
        """Before a replay: copy the live batch's ids into the graph's buffers.

        Raises:
            RuntimeError: the graph was captured without the buffers.
            ValueError: the batch's ids do not have one row per batch row.
            MissingRequestIdsError: the batch has no ids (names the oracle's variable).
        """
        buffers = self._buffers.get(id(graph_runner))
        if buffers is None:
            raise RuntimeError(
                f"KV canary request ids: {type(graph_runner).__name__} replays a graph that was "
                "captured without the request-id buffers (its capture did not go through the "
                "hooked capture_one_batch_size)"
            )
        rids_int, rooms = request_ids_of(forward_batch)
        if rids_int.shape[0] != forward_batch.batch_size:
            raise ValueError(
                f"KV canary request ids: {rids_int.shape[0]} ids for a replayed batch of "
                f"{forward_batch.batch_size} rows"
            )
        # The id tensors are never written (BatchRequestIds reuses them while a batch keeps its
        # requests): the same tensors, the same contents.
        source = self._sources.get(id(graph_runner))
        if source is not None and source[0] is rids_int and source[1] is rooms:
            return
        buffers.fill(rids_int=rids_int, bootstrap_room_ids_int=rooms)
        self._sources[id(graph_runner)] = (rids_int, rooms)

    def offer_tokens(self, *, graph_runner: Any, forward_batch: Any) -> None:
        """A graph's replay is prepared: offer a decode graph's next tokens to the sampler of
        this batch; withdraw any offer for other graphs."""
        sampling_info = getattr(forward_batch, "sampling_info", None)
        if id(graph_runner) in self._token_graph_runners and sampling_info is not None:
            self.graph_tokens.offer(sampling_info=sampling_info,
                                    tokens=self._buffers[id(graph_runner)].next_tokens)
        else:
            self.graph_tokens.withdraw()
