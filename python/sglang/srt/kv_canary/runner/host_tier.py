"""The host tier of one canary: records follow KV pages to host memory and back.

With ``--enable-hierarchical-cache`` SGLang's ``HiCacheController`` copies cached KV pages from
device slots to host slots (``backup_from_device_all_layer``, on its write stream) and later
copies them into *new* device slots (``load_to_device_per_layer``, layer by layer on its load
stream; the forward that reads them waits for each layer). :class:`HostTierRecords` moves the
records with the same index tensors:

* **backup** (on SGLang's write stream, beside the KV copy): ``host_records[h] = records[d]``
  and ``host_origins[h] = d``, the device slot the copy came from;
* **load** (captured when SGLang starts the copy of layer 0, so with the indices the copy uses):
  before the next forward's pre launch, on the forward's stream, ``records[d] =
  host_records[h]``. The pre launch then verifies chain, position, token and ownership of the
  loaded slots exactly as for slots written on the device: a page loaded into other slots than
  the ones its request reads, or a stale page, is reported there;
* **re-key** (between that forward's model and its post launch, when every layer has arrived):
  the ``rekey_loaded`` launch checks each loaded slot's bytes against the restored fingerprint,
  whose ``partial`` windows the origin slot placed, and stores the fingerprint the new slot's
  windows give, or its complement where the bytes differ. The post launch then reports changed
  bytes (a corrupted host copy, a load that never arrived) as ``verify_real_kv_hash`` at the
  load-back forward.

The host records are device tensors (int64 ``[host slots, 4]`` and ``[host slots]``: 40 B per
host slot, budgeted with the KV cell size): every copy is a stream-ordered device operation and
nothing waits for the host. Nothing here synchronizes; the index tensors are converted on the
current stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES, RECORD_FIELDS
from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState, LoadedSlots

# Device bytes per host slot: its record and its origin slot.
HOST_RECORD_BYTES = RECORD_BYTES + 8


def host_record_bytes_per_token(*, hicache_ratio: float) -> int:
    """Device bytes the host tier adds per device KV token: SGLang sizes the host pool as
    ``hicache_ratio`` host slots per device slot (plus one page, budgeted as fixed bytes)."""
    return int(-(-HOST_RECORD_BYTES * hicache_ratio // 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Load:
    """One load SGLang started: the host and device slots of its copy, on the pool's device."""

    host_slots: torch.Tensor
    device_slots: torch.Tensor


class HostTierRecords:
    """Records of the host slots of one host KV pool (see the module docstring).

    Args:
        state: the canary's device state (its ``records`` are read and written).
        num_host_slots: the host pool's size (every index SGLang's host allocator hands out).
        rekey: the ``rekey_loaded`` launch (``(*, state, loaded)``).
    """

    def __init__(self, *, state: CanaryDeviceState, num_host_slots: int,
                 rekey: Callable[..., None]) -> None:
        if num_host_slots < 1:
            raise ValueError(f"num_host_slots must be >= 1, got {num_host_slots}")
        self._state = state
        self._rekey = rekey
        device = state.records.device
        with torch.inference_mode(False):
            self.host_records = torch.zeros((num_host_slots, RECORD_FIELDS), dtype=torch.int64,
                                            device=device)
            self.host_origins = torch.zeros(num_host_slots, dtype=torch.int64, device=device)
        self._started: list[_Load] = []  # loads whose records wait for the next forward
        self._restored: list[_Load] = []  # loads restored, waiting for the re-key
        self.backed_up_slots = 0  # host slots written, over the server's life
        self.loaded_slots = 0  # device slots restored from the host, over the server's life

    @property
    def num_host_slots(self) -> int:
        return self.host_records.shape[0]

    @property
    def device_bytes(self) -> int:
        return (self.host_records.numel() + self.host_origins.numel()) * 8

    @property
    def busy(self) -> bool:
        """Whether loads are started or restored but not re-keyed yet (the radix sweep waits:
        a loaded node's records or fingerprints are not final)."""
        return bool(self._started or self._restored)

    def on_backup(self, *, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """SGLang enqueued the copy of ``device_slots`` into ``host_slots`` on the current
        stream: copy their records and origins beside it, in the same stream order."""
        host, slots = self._indices(host_slots, device_slots)
        self.host_records.index_copy_(0, host, self._state.records.index_select(0, slots))
        self.host_origins.index_copy_(0, host, slots)
        self.backed_up_slots += host.shape[0]

    def on_load_started(self, *, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """SGLang starts copying ``host_slots`` into ``device_slots`` (the indices its copy of
        every layer uses): restore their records before the next forward. The tensors are kept
        as they are (the current stream is SGLang's load stream) and converted on the forward's
        stream."""
        self._check_shapes(host_slots, device_slots)
        self._started.append(_Load(host_slots=host_slots, device_slots=device_slots))

    def restore_started(self) -> None:
        """Before a forward's pre launch, on its stream: the started loads' records into their
        device slots, in the order SGLang started them."""
        records = self._state.records
        for started in self._started:
            host, slots = self._indices(started.host_slots, started.device_slots)
            load = _Load(host_slots=host, device_slots=slots)
            records.index_copy_(0, load.device_slots,
                                self.host_records.index_select(0, load.host_slots))
            self.loaded_slots += load.device_slots.shape[0]
            self._restored.append(load)
        self._started.clear()

    def rekey_restored(self) -> None:
        """Between the model forward and the post launch of the forward that read the loaded
        slots (every layer waited for): re-key their fingerprints (one launch; none without
        real data)."""
        if not self._restored:
            return
        loads, self._restored = self._restored, []
        if self._state.real_data is None:
            return
        slots = torch.cat([load.device_slots for load in loads])
        origins = torch.cat([self.host_origins.index_select(0, load.host_slots)
                             for load in loads])
        self._rekey(state=self._state, loaded=LoadedSlots(slots=slots, origins=origins))

    @staticmethod
    def _check_shapes(host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        if host_slots.shape != device_slots.shape or host_slots.dim() != 1:
            raise ValueError(
                f"host tier: host and device slots must be two 1-D tensors of one length, got "
                f"{tuple(host_slots.shape)} and {tuple(device_slots.shape)}"
            )

    def _indices(self, host_slots: torch.Tensor,
                 device_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both index tensors as int64 on the records' device, converted on the current stream
        and marked as used by it (SGLang allocated them on its own streams)."""
        self._check_shapes(host_slots, device_slots)
        device = self.host_records.device
        converted = []
        for indices in (host_slots, device_slots):
            indices = indices.to(device=device, dtype=torch.int64, non_blocking=True)
            if indices.is_cuda:
                indices.record_stream(torch.cuda.current_stream(device))
            converted.append(indices)
        return converted[0], converted[1]
