"""Per-request integer identity: hashed request ids, bootstrap rooms, generalized ids.

Every row of a forward batch carries two int64 ids when the token oracle is enabled:

* ``rids_int``: the request's ``rid`` hashed with BLAKE2b (8-byte digest) and read as a
  little-endian *signed* int64;
* ``bootstrap_room_ids_int``: the request's PD-disaggregation ``bootstrap_room``, or -1 where it
  is None.

The *generalized* request id of a row is its bootstrap room when that is >= 0, else its
``rids_int``, so the prefill and decode servers of one PD pair agree on it.

The two tensors live as attributes of the ``ForwardBatch`` and of its ``SamplingBatchInfo``
(names :data:`RIDS_INT_ATTR`, :data:`BOOTSTRAP_ROOM_IDS_INT_ATTR`); :func:`request_ids_of` reads
them back and raises :class:`MissingRequestIdsError` when they are absent.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import operator
from collections.abc import Sequence

import torch

from sglang.jit_kernel.kv_canary.hashing import require_int64_same_shape
from sglang.srt.kv_canary.batch.carrier import BOOTSTRAP_ROOM_IDS_INT_ATTR, RIDS_INT_ATTR
RID_PAD_VALUE = 0  # rids_int of a padded row
ROOM_PAD_VALUE = -1  # bootstrap_room_ids_int of a padded row (and of a request without a room)
_INT64_MAX = (1 << 63) - 1
_ORACLE_VARIABLE = "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"
_MAX_WARNED_ROOMS = 64  # bounded: a client must not make the log or this set grow without end
_WARNED_ROOMS: set[str] = set()  # repr of each invalid room warned about
logger = logging.getLogger(__name__)


class MissingRequestIdsError(RuntimeError):
    """A batch has no per-request ids: it was not built with the token oracle enabled."""


@functools.lru_cache(maxsize=1 << 14)
def stable_hash_str_to_i64(rid: str) -> int:
    """BLAKE2b (digest size 8) of the UTF-8 bytes of ``rid``, as a little-endian signed int64.

    Stable across processes and Python versions (unlike ``hash``). Cached: a running request is
    hashed once, not once per step.

    Raises:
        TypeError: ``rid`` is not a ``str``.
    """
    if not isinstance(rid, str):
        raise TypeError(f"rid must be a str, got {type(rid).__name__} ({rid!r})")
    digest = hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, byteorder="little", signed=True)


def room_to_i64(bootstrap_room: object) -> int:
    """The room as int64, or -1 (no room) where ``bootstrap_room`` is None or not a valid room.

    A client chooses its request's ``bootstrap_room`` and SGLang does not range-check it; an
    invalid one (negative, above 2**63 - 1, not an int) must never take the scheduler down, so
    it falls back to "no room": the row's generalized id is its hashed rid. (Only a PD pair
    needs rooms, and there SGLang's own bootstrap rejects invalid ones first.)
    """
    if bootstrap_room is None:
        return ROOM_PAD_VALUE
    valid = isinstance(bootstrap_room, int) and not isinstance(bootstrap_room, bool)
    if not valid or not 0 <= bootstrap_room <= _INT64_MAX:
        key = repr(bootstrap_room)  # a client's room may be unhashable (a list from JSON)
        if key not in _WARNED_ROOMS and len(_WARNED_ROOMS) < _MAX_WARNED_ROOMS:
            _WARNED_ROOMS.add(key)
            logger.warning(
                f"KV canary request ids: bootstrap_room={bootstrap_room!r} is not a valid room "
                "(an integer in [0, 2**63 - 1]); the request is identified by its rid instead"
            )
        return ROOM_PAD_VALUE
    return bootstrap_room


def _host_rows_to_device(rows: Sequence[Sequence[int]], device: torch.device | str) -> torch.Tensor:
    """One int64 tensor ``[len(rows), n]`` on ``device``, with a single host-to-device copy.

    On CUDA the host staging tensor is pinned, so the copy is asynchronous and does not wait
    for the device.
    """
    target = torch.device(device)
    pin = target.type == "cuda"
    host = torch.tensor(rows, dtype=torch.int64, pin_memory=pin)
    return host.to(target, non_blocking=pin)


def hash_rids_to_tensor(*, rids: Sequence[str], device: torch.device | str) -> torch.Tensor:
    """``rids_int``: int64 ``[len(rids)]`` on ``device``, :func:`stable_hash_str_to_i64` of each."""
    return _host_rows_to_device([[stable_hash_str_to_i64(rid) for rid in rids]], device)[0]


def bootstrap_rooms_to_tensor(
    *, bootstrap_rooms: Sequence[int | None], device: torch.device | str
) -> torch.Tensor:
    """``bootstrap_room_ids_int``: int64 ``[len(bootstrap_rooms)]``; None and invalid rooms
    become -1 (see :func:`room_to_i64`)."""
    return _host_rows_to_device([[room_to_i64(room) for room in bootstrap_rooms]], device)[0]


def request_ids_to_tensors(
    *, rids: Sequence[str], bootstrap_rooms: Sequence[int | None], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rids_int, bootstrap_room_ids_int)`` of one batch with one host-to-device copy.

    Both are int64 ``[n]`` rows of one ``[2, n]`` device tensor (each row contiguous).

    Raises:
        ValueError: ``rids`` and ``bootstrap_rooms`` differ in length.
    """
    if len(rids) != len(bootstrap_rooms):
        raise ValueError(
            f"rids ({len(rids)}) and bootstrap_rooms ({len(bootstrap_rooms)}) differ in length"
        )
    both = _host_rows_to_device(
        [
            [stable_hash_str_to_i64(rid) for rid in rids],
            [room_to_i64(room) for room in bootstrap_rooms],
        ],
        device,
    )
    return both[0], both[1]


def generalized_req_id(*, rid: str, bootstrap_room: object) -> int:
    """One request's generalized id on the host: its room when it has a valid one (see
    :func:`room_to_i64`), else its hashed rid; :func:`select_generalized_req_ids` per element."""
    room = room_to_i64(bootstrap_room)
    return room if room >= 0 else stable_hash_str_to_i64(rid)


def select_generalized_req_ids(
    *, vanilla_req_ids: torch.Tensor, bootstrap_room_ids_int: torch.Tensor | None
) -> torch.Tensor:
    """Per row: the bootstrap room when it is >= 0, else the hashed rid.

    Args:
        vanilla_req_ids: int64 ``[n]`` (``rids_int``).
        bootstrap_room_ids_int: int64 ``[n]``, -1 where a request has no room; None when no
            request has one (then the result is ``vanilla_req_ids`` itself).
    Returns:
        int64 ``[n]`` on the same device. Elementwise, no host sync: CUDA-graph capturable.
    Raises:
        TypeError / ValueError: a dtype is not int64, or the shapes differ.
    """
    if bootstrap_room_ids_int is None:
        if vanilla_req_ids.dtype != torch.int64:
            raise TypeError(f"vanilla_req_ids must be int64, got {vanilla_req_ids.dtype}")
        return vanilla_req_ids
    require_int64_same_shape(("vanilla_req_ids", vanilla_req_ids),
                             ("bootstrap_room_ids_int", bootstrap_room_ids_int))
    return torch.where(bootstrap_room_ids_int >= 0, bootstrap_room_ids_int, vanilla_req_ids)


def request_ids_of(holder: object) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rids_int, bootstrap_room_ids_int)`` of a ``ForwardBatch`` or ``SamplingBatchInfo``.

    Raises:
        MissingRequestIdsError: the ids are absent (the message names
            SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE and the holder's type).
    """
    rids_int = getattr(holder, RIDS_INT_ATTR, None)
    rooms = getattr(holder, BOOTSTRAP_ROOM_IDS_INT_ATTR, None)
    if rids_int is None or rooms is None:
        raise MissingRequestIdsError(
            f"this {type(holder).__name__} has no per-request ids ({RIDS_INT_ATTR}, "
            f"{BOOTSTRAP_ROOM_IDS_INT_ATTR}); they are set by ForwardBatch.init_new only when "
            f"{_ORACLE_VARIABLE}=1 (batches built another way, e.g. two-batch-overlap children, "
            f"do not have them)"
        )
    return rids_int, rooms


def generalized_req_ids_of(holder: object) -> torch.Tensor:
    """The generalized request ids (int64 ``[rows]``) of a ``ForwardBatch``/``SamplingBatchInfo``.

    Raises:
        MissingRequestIdsError: see :func:`request_ids_of`.
    """
    rids_int, rooms = request_ids_of(holder)
    return select_generalized_req_ids(vanilla_req_ids=rids_int, bootstrap_room_ids_int=rooms)


class BatchRequestIds:
    """:func:`request_ids_to_tensors` of consecutive batches, reusing the last batch's tensors
    while its requests (rids and rooms, in order) are unchanged: a decode batch keeps its
    requests for many steps, and each call would otherwise cost a pinned host tensor and a copy.

    The returned tensors are shared between the batches that reuse them: nothing may write into
    them (every consumer reads them or copies them).
    """

    def __init__(self, *, device: torch.device | str) -> None:
        self._device = device
        self._key: tuple[tuple[str, ...], tuple[object, ...]] | None = None
        self._tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        self._requests: tuple[object, ...] = ()  # the last batch's requests (strong references)

    def tensors_for_requests(
        self, requests: Sequence[object]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`tensors_for` of the requests' ``rid`` and ``bootstrap_room`` (SGLang's ``Req``,
        whose two ids never change), without reading them when the batch holds the same request
        objects, in the same order, as the last call's (a decode batch, step after step)."""
        last = self._requests
        if (self._tensors is not None and len(requests) == len(last)
                and all(map(operator.is_, requests, last))):
            return self._tensors
        tensors = self.tensors_for(
            rids=[request.rid for request in requests],
            bootstrap_rooms=[request.bootstrap_room for request in requests],
        )
        self._requests = tuple(requests)
        return tensors

    def tensors_for(
        self, *, rids: Sequence[str], bootstrap_rooms: Sequence[object]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rids_int, bootstrap_room_ids_int)`` of one batch (see
        :func:`request_ids_to_tensors`, whose errors it raises)."""
        key = (tuple(rids), tuple(bootstrap_rooms))
        if self._tensors is None or key != self._key:
            self._tensors = request_ids_to_tensors(
                rids=rids, bootstrap_rooms=bootstrap_rooms, device=self._device
            )
            self._key = key
            self._requests = ()  # the tensors are no longer those of the last requests
        return self._tensors
