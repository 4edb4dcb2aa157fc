"""What the canary kernels read and write: one forward's batch view and one pool's device state.

Both are frozen value types built by the runtime. Construction validates shapes, dtypes,
layouts and devices (attribute reads only: no host-device synchronization, no allocation) and
raises ``ValueError`` (shape, layout, device, value) or ``TypeError`` (type, dtype) naming the
field, so a bad tensor fails loudly at capture or in the first eager forward instead of reading
garbage inside a kernel.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, RECORD_FIELDS, RING_ROW_FIELDS

_INDEX_DTYPES = (torch.int32, torch.int64)


class BatchLayout(enum.IntEnum):
    """How a forward's tokens map to its batch rows."""

    DECODE = 0  # one token per row: token i = row i; prefix_len = seq_lens[i] - 1
    EXTEND = 1  # row i writes tokens [extend_start_loc[i], +extend_seq_lens[i]);
    # prefix_len = extend_prefix_lens[i] (covers prefill, chunked prefill, mixed)


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryBatchView:
    """Device tensors of one forward; views of ForwardBatch fields, never copies.

    Integer tensors may be int32 or int64 (the kernels load either), one-dimensional and
    contiguous, except where a field says otherwise. ``bs`` is ``req_pool_indices.shape[0]``;
    ``num_tokens`` is ``input_ids.shape[0]`` (``== bs`` for ``DECODE``).

    A row with ``req_pool_indices[b] == 0`` is padding and is skipped entirely; a token whose
    ``out_cache_loc`` is 0 is not written. ``extend_*`` are given for ``EXTEND`` and only then.

    Token checks: the write-input assert compares each written token with
    ``expected_input_ids[i]``, or, where that is ``NO_EXPECTED_TOKEN`` and the history is given,
    with the history's token at the token's position (``prefix_len + k``) when that position is
    known; verify-token compares each verified slot with the history (see
    :mod:`.canary_kernels_ref`).
    """

    layout: BatchLayout
    req_pool_indices: torch.Tensor  # [bs]
    seq_lens: torch.Tensor  # [bs]
    extend_prefix_lens: torch.Tensor | None  # [bs]   EXTEND only
    extend_seq_lens: torch.Tensor | None  # [bs]   EXTEND only
    extend_start_loc: torch.Tensor | None  # [bs]   EXTEND only
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    out_cache_loc: torch.Tensor  # [num_tokens]; slot written for token i (0 = skip)
    # Write-input assert (None = off): the expected input token / position of every token;
    # NO_EXPECTED_TOKEN (-1) in an entry means "no expectation" for that token / position.
    expected_input_ids: torch.Tensor | None = None  # [num_tokens] int64
    expected_positions: torch.Tensor | None = None  # [num_tokens] int64
    # Token history (None = off; both or neither): the known token of (req pool row, position);
    # positions >= expected_token_valid_lens[row] of a pool row are unknown. Indexed by POOL ROW
    # (``req_pool_indices[b]``), so persistent tensors serve every forward, graph replays too.
    expected_token_pool: torch.Tensor | None = None  # int32 [req_pool_rows, max_context_len]
    expected_token_valid_lens: torch.Tensor | None = None  # int64 [req_pool_rows]
    # With the history: True compares every verified slot's stored token with it (VERIFY_TOKEN);
    # False uses it only as the write-input assert's fallback expectation.
    verify_token: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.layout, BatchLayout):
            raise TypeError(f"CanaryBatchView.layout must be a BatchLayout, got {self.layout!r}")
        bs = _vector(self, "req_pool_indices", _INDEX_DTYPES).shape[0]
        _vector(self, "seq_lens", _INDEX_DTYPES, length=bs)
        extend_fields = ("extend_prefix_lens", "extend_seq_lens", "extend_start_loc")
        if self.layout is BatchLayout.EXTEND:
            for name in extend_fields:
                _vector(self, name, _INDEX_DTYPES, length=bs)
        else:
            given = [name for name in extend_fields if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"CanaryBatchView: layout DECODE takes no extend tensors, got {given}"
                )
        num_tokens = _vector(self, "input_ids", _INDEX_DTYPES).shape[0]
        if self.layout is BatchLayout.DECODE and num_tokens != bs:
            raise ValueError(
                f"CanaryBatchView.input_ids: layout DECODE needs one token per row "
                f"(bs={bs}), got {num_tokens} tokens"
            )
        _vector(self, "positions", _INDEX_DTYPES, length=num_tokens)
        _vector(self, "out_cache_loc", _INDEX_DTYPES, length=num_tokens)
        for name in ("expected_input_ids", "expected_positions"):
            if getattr(self, name) is not None:
                _vector(self, name, (torch.int64,), length=num_tokens)
        has_pool = self.expected_token_pool is not None
        if has_pool != (self.expected_token_valid_lens is not None):
            raise ValueError(
                "CanaryBatchView: expected_token_pool and expected_token_valid_lens are given "
                f"together or not at all (pool given: {has_pool})"
            )
        if has_pool:
            pool = _matrix(self, "expected_token_pool", torch.int32)
            _vector(self, "expected_token_valid_lens", (torch.int64,), length=pool.shape[0])
        if not isinstance(self.verify_token, bool):
            raise TypeError(
                f"CanaryBatchView.verify_token must be a bool, got {self.verify_token!r}"
            )
        _same_device(self, self.req_pool_indices.device)

    @property
    def batch_size(self) -> int:
        return self.req_pool_indices.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.req_pool_indices.device


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryDeviceState:
    """Preallocated once per KV pool; every tensor on the pool's device.

    ``records`` row = KV-pool slot (layout in :mod:`.consts`). ``real_kv_words`` is the first
    layer's K buffer viewed as int64 words, row = slot (SGLang's token-indexed buffer, so
    ``page_size > 1`` needs nothing special); its rows may be strided but each row's words are
    contiguous. ``real_kv_num_words`` words of each row are folded into the fingerprint: 0 when
    real data is off (then ``real_kv_words`` is None), 2 for partial (16 bytes), the row's word
    count for all.
    """

    records: torch.Tensor  # int64 [num_slots, RECORD_FIELDS]
    req_to_token: torch.Tensor  # int32 [req_pool_rows, max_context_len] (SGLang's, not a copy)
    ring: torch.Tensor  # int64 [ring_capacity, RING_ROW_FIELDS]
    counters: torch.Tensor  # int64 [NUM_COUNTERS]
    real_kv_words: torch.Tensor | None  # int64 [num_kv_rows, words_per_row] (None = off)
    real_kv_num_words: int  # 0 off, 2 partial (16 B), words_per_row all

    def __post_init__(self) -> None:
        records = _matrix(self, "records", torch.int64, contiguous=True)
        if records.shape[1] != RECORD_FIELDS:
            raise ValueError(
                f"CanaryDeviceState.records must be [num_slots, {RECORD_FIELDS}], "
                f"got {tuple(records.shape)}"
            )
        _matrix(self, "req_to_token", torch.int32)
        ring = _matrix(self, "ring", torch.int64, contiguous=True)
        if ring.shape[0] < 1 or ring.shape[1] != RING_ROW_FIELDS:
            raise ValueError(
                f"CanaryDeviceState.ring must be [capacity >= 1, {RING_ROW_FIELDS}], "
                f"got {tuple(ring.shape)}"
            )
        _vector(self, "counters", (torch.int64,), length=NUM_COUNTERS)
        num_words = self.real_kv_num_words
        if not isinstance(num_words, int) or isinstance(num_words, bool):
            raise TypeError(
                f"CanaryDeviceState.real_kv_num_words must be an int, got {num_words!r}"
            )
        if self.real_kv_words is None:
            if num_words != 0:
                raise ValueError(
                    "CanaryDeviceState.real_kv_num_words must be 0 when real_kv_words is None, "
                    f"got {num_words}"
                )
        else:
            words = _matrix(self, "real_kv_words", torch.int64)
            if not 1 <= num_words <= words.shape[1]:
                raise ValueError(
                    f"CanaryDeviceState.real_kv_num_words must be in [1, {words.shape[1]}] "
                    f"(words per row of real_kv_words), got {num_words}"
                )
        _same_device(self, records.device)

    @property
    def num_slots(self) -> int:
        return self.records.shape[0]

    @property
    def ring_capacity(self) -> int:
        return self.ring.shape[0]

    @property
    def device(self) -> torch.device:
        return self.records.device


def check_same_device(*, state: CanaryDeviceState, batch: CanaryBatchView) -> None:
    """Raise ``ValueError`` unless the batch view lives on the state's device."""
    if batch.device != state.device:
        raise ValueError(
            f"CanaryBatchView is on {batch.device} but CanaryDeviceState is on {state.device}"
        )


# ----------------------------------------------------------------------------- validation


def _tensor(owner: object, name: str) -> torch.Tensor:
    value = getattr(owner, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(owner).__name__}.{name} must be a torch.Tensor, got {value!r}")
    return value


def _check_dtype(owner: object, name: str, tensor: torch.Tensor, dtypes: tuple) -> None:
    if tensor.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{type(owner).__name__}.{name} must be {allowed}, got {tensor.dtype}")


def _vector(
    owner: object, name: str, dtypes: tuple, *, length: int | None = None
) -> torch.Tensor:
    tensor = _tensor(owner, name)
    _check_dtype(owner, name, tensor, dtypes)
    if tensor.dim() != 1 or (length is not None and tensor.shape[0] != length):
        expected = "[n]" if length is None else f"[{length}]"
        raise ValueError(
            f"{type(owner).__name__}.{name} must have shape {expected}, got {tuple(tensor.shape)}"
        )
    if tensor.shape[0] > 1 and tensor.stride(0) != 1:
        raise ValueError(
            f"{type(owner).__name__}.{name} must be contiguous, got stride {tensor.stride()}"
        )
    return tensor


def _matrix(
    owner: object, name: str, dtype: torch.dtype, *, contiguous: bool = False
) -> torch.Tensor:
    tensor = _tensor(owner, name)
    _check_dtype(owner, name, tensor, (dtype,))
    if tensor.dim() != 2:
        raise ValueError(
            f"{type(owner).__name__}.{name} must be two-dimensional, got {tuple(tensor.shape)}"
        )
    if contiguous and not tensor.is_contiguous():
        raise ValueError(f"{type(owner).__name__}.{name} must be contiguous")
    if not contiguous and tensor.shape[1] > 1 and tensor.stride(1) != 1:
        raise ValueError(
            f"{type(owner).__name__}.{name} rows must be contiguous, got strides "
            f"{tensor.stride()}"
        )
    return tensor


def _same_device(owner: object, device: torch.device) -> None:
    for name in owner.__slots__:  # type: ignore[attr-defined]
        value = getattr(owner, name)
        if isinstance(value, torch.Tensor) and value.device != device:
            raise ValueError(
                f"{type(owner).__name__}.{name} is on {value.device}, expected {device} "
                "(all tensors on one device)"
            )
