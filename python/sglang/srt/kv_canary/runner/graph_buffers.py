"""Graph-resident per-request ids (and the oracle's next tokens) for a CUDA graph runner (decode,
EAGLE draft).

Code captured into a CUDA graph that reads a batch's request ids (the write-input assert's
oracle expectations) must read *static* tensors, refreshed before every replay. Each graph
runner gets one :class:`GraphRequestIdBuffers` (``[max_bs]``; rids 0, rooms -1), owned by the
model runner's canary:

* capture: the batch the captured forward receives carries the views ``[:bs]``;
* replay: ``[:raw_bs]`` is copied from the live batch and ``[raw_bs:]`` reset to 0 / -1, so no
  id of an earlier replay survives in a padded row.

A decode graph also writes its rows' next oracle tokens into ``next_tokens`` (see
:mod:`sglang.srt.kv_canary.token_oracle.graph_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.kv_canary.token_oracle.request_ids import RID_PAD_VALUE, ROOM_PAD_VALUE


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
