"""One forward's host-to-device row data: the seq_lens mirror and the request rows' updates.

:class:`RowUploader` owns the persistent device *upload area* and the pinned host ring
(:class:`~.upload_buffers.UploadBufferRing`) the uploads go through. The area is read by
captured graphs at fixed addresses: its head is the **live row count** (one int64: how many
rows the scheduler sent; a replayed graph's padded rows lie past it, and the kernels leave them
alone), then the **seq_lens mirror** (one int64 per batch row: the scheduler's
``seq_lens_cpu``, which the pre launch compares with the device ``seq_lens`` the forward uses),
then the staging of the **row updates** (the packed sections of
:class:`~.request_rows.RowUpdates`: token-history scatter, owner chains, admission checks).

Per forward, outside graphs, on the forward's stream, never waiting:

* :meth:`RowUploader.upload_seq_lens`: one host copy of the row count and ``seq_lens_cpu`` into a
  ring buffer (numpy, no per-row Python) and one non-blocking copy to the head of the area. A decode step uploads
  nothing else: every row in it is known to the device.
* :meth:`RowUploader.apply`: one non-blocking copy of the packed updates into the staging, its
  sections applied (a scatter launch, an ``index_copy_``, an admission launch: each only when
  its section has rows) and the host bookkeeping committed. The sections of a layout (its
  segment sizes) are cut once and reused when the layout comes again, up to
  :data:`STAGED_LAYOUTS` of them; an upload larger than the staging goes to a buffer of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.runner.request_rows import RequestRows, RowUpdates, UploadSections
from sglang.srt.kv_canary.runner.upload_buffers import UploadBufferRing
from sglang.srt.kv_canary.token_history.history import TokenHistory

STAGED_LAYOUTS = 8  # upload layouts whose sections stay cut from the staging area

# (segment sizes, has_history, has_owners, has_admissions) of one packed upload
_LayoutKey = tuple[tuple[int, ...], bool, bool, bool]


class RowUploader:
    """The upload area and ring of one canary (see the module docstring).

    Args:
        state: the canary's device state (its owner chains are written here).
        request_rows: the host bookkeeping the applied updates are committed to.
        token_history: the device token history, or None with the token checks off.
        admission_check: the admission launch (``(*, state, req_pool_indices, prefix_lens,
            chains)``, :mod:`sglang.jit_kernel.kv_canary.admission_owner`).
        ring: the pinned host ring (shared with ``request_rows``, which packs into it).
        mirror_rows: rows of the seq_lens mirror (any batch's row count).
        staging_words: int64 words of the row updates' staging.
        device: the device of ``state``.
    """

    def __init__(
        self,
        *,
        state: CanaryDeviceState,
        request_rows: RequestRows,
        token_history: TokenHistory | None,
        admission_check: Callable[..., None],
        ring: UploadBufferRing,
        mirror_rows: int,
        staging_words: int,
        device: torch.device,
    ) -> None:
        self._state = state
        self._request_rows = request_rows
        self._token_history = token_history
        self._admission_check = admission_check
        self._ring = ring
        self._device = device
        with torch.inference_mode(False):
            self._area = torch.zeros((1 + mirror_rows + staging_words,), dtype=torch.int64,
                                     device=device)
        self.live_rows = self._area[:1]
        self.seq_lens_mirror = self._area[1 : 1 + mirror_rows]
        self._staging = self._area[1 + mirror_rows :]
        self._staged: dict[_LayoutKey, tuple[torch.Tensor, UploadSections]] = {}
        # the mirror's first rows per batch size, cut once (a view per size; at most one per
        # row count of the mirror)
        self._mirror_views: dict[int, torch.Tensor] = {}

    @property
    def device_bytes(self) -> dict[str, int]:
        """Bytes of the mirror and of the staging."""
        return {
            "seq_lens_mirror": (1 + self.seq_lens_mirror.numel()) * 8,
            "upload_staging": self._staging.numel() * 8,
        }

    def open(self, *, landed: Callable[[], int]) -> None:
        """Serving starts: the ring hands out its buffers from now on (see
        :meth:`UploadBufferRing.open`)."""
        self._ring.open(landed=landed)

    def upload_seq_lens(self, seq_lens_cpu: torch.Tensor, *, mark: int) -> None:
        """Copy the row count ``bs`` and the scheduler's ``seq_lens_cpu`` (int64 CPU ``[bs]``) to
        :attr:`live_rows` and the mirror's first rows, in one copy (``mark``: the number of the
        counter publication that follows this copy on the stream).

        Raises:
            ValueError: the batch has more rows than the mirror.
        """
        rows = seq_lens_cpu.shape[0]
        target = self._mirror_views.get(rows)
        if target is None:
            if rows > self.seq_lens_mirror.shape[0]:
                raise ValueError(
                    f"KV canary: a batch of {rows} rows is larger than the seq_lens mirror "
                    f"({self.seq_lens_mirror.shape[0]} rows)"
                )
            target = self._mirror_views[rows] = self._area[: 1 + rows]
        buffer = self._ring.take(1 + rows)
        buffer.array[0] = rows
        buffer.array[1 : 1 + rows] = seq_lens_cpu.numpy()
        self._ring.copy(buffer, to=target, mark=mark)

    def apply(self, updates: RowUpdates, *, mark: int) -> None:
        """Copy ``updates.packed`` to the device, apply its sections and commit the bookkeeping
        (``mark`` as for :meth:`upload_seq_lens`). An empty update is committed only."""
        if not updates.empty:
            sections = self._copy(updates, mark=mark)
            self._apply_sections(updates, sections)
        self._request_rows.commit(updates)

    def _copy(self, updates: RowUpdates, *, mark: int) -> UploadSections:
        key = (updates.segment_sizes, updates.has_history, updates.has_owners,
               updates.has_admissions)
        staged = self._staged.get(key)
        if staged is not None:
            target, sections = staged
        else:
            words = updates.packed.shape[0]
            if words <= self._staging.shape[0]:
                target = self._staging[:words]
                sections = updates.sections_on(target)
                if len(self._staged) >= STAGED_LAYOUTS:
                    del self._staged[next(iter(self._staged))]  # the oldest
                self._staged[key] = (target, sections)
            else:
                target = torch.empty((words,), dtype=torch.int64, device=self._device)
                sections = updates.sections_on(target)
        if updates.upload_buffer is None:
            target.copy_(updates.packed, non_blocking=True)
        else:
            self._ring.copy(updates.upload_buffer, to=target, mark=mark)
        return sections

    def _apply_sections(self, updates: RowUpdates, sections: UploadSections) -> None:
        history = sections.history
        if history is not None and updates.history_rows > 0:
            self._token_history.scatter(
                req_pool_indices=history.req_pool_indices, lens=history.req_all_ids_lens,
                offsets=history.offsets, tokens=history.req_all_ids_flat,
            )
        if updates.owner_rows > 0:
            owners = sections.owners
            self._state.owner_chains.index_copy_(0, owners.rows, owners.values)
        if updates.admission_rows > 0:
            admissions = sections.admissions
            self._admission_check(
                state=self._state, req_pool_indices=admissions.rows,
                prefix_lens=admissions.prefix_lens, chains=admissions.chains,
            )

