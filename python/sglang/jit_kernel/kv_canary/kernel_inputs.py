"""What the canary launches read and write: validated frozen value types.

- :class:`CanaryDeviceState` (one per KV pool): records, ``req_to_token``, violation ring,
  counters, per-request owner chains, the optional :class:`RealDataSources` and the optional
  :class:`SlotWindow` (a second slot space read through a table over a trailing window).
- :class:`CanaryBatchView` (one per forward): views of the ForwardBatch tensors.
- :class:`SweepEntries` (one per sweep): the slots to check and what they must hold.
- :func:`check_scatter_inputs`: the input contract of the token-history scatter.
- :func:`check_hash_oracle_inputs`: the input contract of the token oracle's launch.

Construction validates types, dtypes, shapes, layouts and devices from tensor attributes only
(no host-device synchronization, no allocation) and raises ``TypeError`` (type, dtype) or
``ValueError`` (shape, layout, device, value) naming the class and field, so a bad tensor fails
loudly at capture time or in the first eager forward instead of being read as garbage inside a
kernel. Tensor *values* are never checked here: the kernels mask every index they read, so a
corrupt index becomes a reported violation, never a memory fault.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from sglang.jit_kernel.kv_canary.consts import (
    MAX_REAL_DATA_SOURCES,
    NUM_COUNTERS,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
)

_INDEX_DTYPES = (torch.int32, torch.int64)


class BatchLayout(enum.IntEnum):
    """How a forward's tokens map to its batch rows."""

    DECODE = 0  # one token per row: token b = row b; prefix length = seq_lens[b] - 1
    EXTEND = 1  # row b writes tokens [extend_start_loc[b], + extend_seq_lens[b]); prefix length
    # = extend_prefix_lens[b] (prefill, chunked prefill, mixed batches)


@dataclass(frozen=True, slots=True, kw_only=True)
class RealDataSources:
    """The real K/V bytes a slot's fingerprint folds (see :mod:`.hashing`).

    ``sources``: 1 to ``MAX_REAL_DATA_SOURCES`` int64 word views ``[num_kv_rows,
    words_per_row]`` of live KV buffers (views, never copies: the fingerprint must read the live
    bytes), row = slot. Each row's words are contiguous; the row stride is arbitrary; sources may
    differ in ``words_per_row`` and ``num_kv_rows``. In SGLang: K and V of the first and of the
    last layer. ``partial``: fold 2 words (16 bytes) per source, rotating over the row with the
    slot (needs ``words_per_row >= 2``), into one lane per source; otherwise fold every word of
    every source. ``verify_stride``: the post launch checks the bytes of prefix position ``p``
    only in forwards whose step ``S`` has ``(p + S) % verify_stride == 0`` (1: every prefix slot
    in every forward), and with ``partial`` only the lane of source ``((p + S) // verify_stride)
    % len(sources)`` (one source read per slot); the new slots' fingerprints are always stored
    whole, and the sweep checks every source of every slot it is given.
    """

    sources: tuple[torch.Tensor, ...]
    partial: bool
    verify_stride: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.sources, tuple):
            raise TypeError(
                f"RealDataSources.sources must be a tuple of tensors, got {type(self.sources)}"
            )
        if not 1 <= len(self.sources) <= MAX_REAL_DATA_SOURCES:
            raise ValueError(
                f"RealDataSources.sources must hold 1 to {MAX_REAL_DATA_SOURCES} tensors, got "
                f"{len(self.sources)}"
            )
        if not isinstance(self.partial, bool):
            raise TypeError(f"RealDataSources.partial must be a bool, got {self.partial!r}")
        stride = self.verify_stride
        if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= 1 << 20:
            raise ValueError(
                f"RealDataSources.verify_stride must be an int in [1, {1 << 20}], got {stride!r}"
            )
        for index, words in enumerate(self.sources):
            name = f"sources[{index}]"
            _check_matrix(self, name, words, torch.int64)
            if words.shape[1] < 1:
                raise ValueError(f"RealDataSources.{name} has no words per row")
            if self.partial and words.shape[1] < 2:
                raise ValueError(
                    f"RealDataSources.{name}: partial fingerprints need words_per_row >= 2, got "
                    f"{words.shape[1]}"
                )
            if words.device != self.sources[0].device:
                raise ValueError(
                    f"RealDataSources.{name} is on {words.device}, expected "
                    f"{self.sources[0].device} (all sources on one device)"
                )

    @property
    def device(self) -> torch.device:
        return self.sources[0].device

    @property
    def words_per_row(self) -> tuple[int, ...]:
        return tuple(words.shape[1] for words in self.sources)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotWindow:
    """A second slot space beside the records': *window slots*, reached from a record slot
    through a table and required only over the trailing window of each row's positions (in
    SGLang: the sliding-window sub-pool of a hybrid pool, whose slots the allocator maps from the
    full sub-pool's and frees once they leave the window).

    - ``slot_table``: int64 ``[T]``, record slot ``s`` -> window slot ``slot_table[s]``; a value
      outside ``[1, G)`` (or ``s`` outside ``[0, T)``) means none (freed, never allocated).
      Not a copy: the allocator's own table.
    - ``owners``: int64 ``[G]``, window slot -> the record slot whose post launch last stamped it
      (0: never); the canary's record group of the window sub-pool.
    - ``window``: a live row with prefix length ``P`` needs window slots at positions
      ``p >= P - window`` (every position the forward's queries attend to); earlier positions
      may have lost theirs.
    - ``windowed_sources``: bit ``k`` set: real-data source ``k`` holds window-slot rows (its
      row for record slot ``s`` is ``slot_table[s]``) and is read only where that is live.
    """

    slot_table: torch.Tensor
    owners: torch.Tensor
    window: int
    windowed_sources: int = 0

    def __post_init__(self) -> None:
        table = _vector(self, "slot_table", (torch.int64,))
        owners = _vector(self, "owners", (torch.int64,))
        if owners.shape[0] < 2:
            raise ValueError(
                f"SlotWindow.owners must have at least 2 rows (slot 0 is none), got "
                f"{owners.shape[0]}"
            )
        window = self.window
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window < 1 << 40:
            raise ValueError(f"SlotWindow.window must be an int in [0, 2**40), got {window!r}")
        mask = self.windowed_sources
        if (isinstance(mask, bool) or not isinstance(mask, int)
                or not 0 <= mask < 1 << MAX_REAL_DATA_SOURCES):
            raise ValueError(
                f"SlotWindow.windowed_sources must be a bit mask in [0, "
                f"{1 << MAX_REAL_DATA_SOURCES}), got {mask!r}"
            )
        _on_device(self, "owners", owners, table.device)

    @property
    def device(self) -> torch.device:
        return self.slot_table.device

    @property
    def num_window_slots(self) -> int:
        return self.owners.shape[0]

    def windows_source(self, source: int) -> bool:
        """Whether real-data source ``source`` is read through the table."""
        return bool(self.windowed_sources >> source & 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryDeviceState:
    """Preallocated once per KV pool; every tensor on the pool's device.

    - ``records``: int64 ``[num_slots, RECORD_FIELDS]``, contiguous, row = KV-pool slot (layout
      in :mod:`.consts`).
    - ``req_to_token``: SGLang's int32 ``[R, L]`` (not a copy); rows contiguous.
    - ``ring``: int64 ``[capacity >= 1, RING_ROW_FIELDS]``, contiguous.
    - ``counters``: int64 ``[NUM_COUNTERS]``.
    - ``owner_chains``: int64 ``[R]``, one per ``req_to_token`` row: the chain value the row's
      next token must be seeded with (``chain_after`` of the request's cached history); 0 means
      unknown (the next forward adopts its own seed). The pre launch advances it.
    - ``real_data``: the fingerprinted KV bytes, or None (real data off).
    - ``window``: the window slots (:class:`SlotWindow`), or None (one slot space).
    """

    records: torch.Tensor
    req_to_token: torch.Tensor
    ring: torch.Tensor
    counters: torch.Tensor
    owner_chains: torch.Tensor
    real_data: RealDataSources | None = None
    window: SlotWindow | None = None

    def __post_init__(self) -> None:
        records = _matrix(self, "records", torch.int64, contiguous=True)
        if records.shape[1] != RECORD_FIELDS:
            raise ValueError(
                f"CanaryDeviceState.records must be [num_slots, {RECORD_FIELDS}], "
                f"got {tuple(records.shape)}"
            )
        table = _matrix(self, "req_to_token", torch.int32)
        ring = _matrix(self, "ring", torch.int64, contiguous=True)
        if ring.shape[0] < 1 or ring.shape[1] != RING_ROW_FIELDS:
            raise ValueError(
                f"CanaryDeviceState.ring must be [capacity >= 1, {RING_ROW_FIELDS}], "
                f"got {tuple(ring.shape)}"
            )
        _vector(self, "counters", (torch.int64,), length=NUM_COUNTERS)
        _vector(self, "owner_chains", (torch.int64,), length=table.shape[0])
        if self.real_data is not None and not isinstance(self.real_data, RealDataSources):
            raise TypeError(
                f"CanaryDeviceState.real_data must be RealDataSources or None, got "
                f"{type(self.real_data).__name__}"
            )
        _same_device(self, records.device)
        if self.real_data is not None and self.real_data.device != records.device:
            raise ValueError(
                f"CanaryDeviceState.real_data is on {self.real_data.device}, expected "
                f"{records.device} (all tensors on one device)"
            )
        window = self.window
        if window is not None:
            if not isinstance(window, SlotWindow):
                raise TypeError(
                    f"CanaryDeviceState.window must be SlotWindow or None, got "
                    f"{type(window).__name__}"
                )
            if window.device != records.device:
                raise ValueError(
                    f"CanaryDeviceState.window is on {window.device}, expected {records.device} "
                    "(all tensors on one device)"
                )
            sources = 0 if self.real_data is None else len(self.real_data.sources)
            if self.real_data is not None and window.windowed_sources >> sources:
                raise ValueError(
                    f"CanaryDeviceState.window.windowed_sources={window.windowed_sources:#x} "
                    f"names a source past the {sources} real-data sources"
                )

    @classmethod
    def zeros(
        cls,
        *,
        num_slots: int,
        req_to_token: torch.Tensor,
        ring_capacity: int,
        real_data: RealDataSources | None = None,
        window: SlotWindow | None = None,
    ) -> CanaryDeviceState:
        """Zeroed records, ring, counters and owner chains on ``req_to_token``'s device.

        Allocates ``num_slots * RECORD_BYTES + ring_capacity * RING_ROW_FIELDS * 8 +
        NUM_COUNTERS * 8 + R * 8`` bytes once; the launches never allocate. A zero record never
        verifies (its stamp is 0 and its chain is not ``CHAIN_ANCHOR``).
        """
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if ring_capacity < 1:
            raise ValueError(f"ring_capacity must be >= 1, got {ring_capacity}")
        device = req_to_token.device

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=device)

        return cls(
            records=zeros(num_slots, RECORD_FIELDS),
            req_to_token=req_to_token,
            ring=zeros(ring_capacity, RING_ROW_FIELDS),
            counters=zeros(NUM_COUNTERS),
            owner_chains=zeros(req_to_token.shape[0]),
            real_data=real_data,
            window=window,
        )

    @property
    def num_slots(self) -> int:
        return self.records.shape[0]

    @property
    def ring_capacity(self) -> int:
        return self.ring.shape[0]

    @property
    def device(self) -> torch.device:
        return self.records.device


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryBatchView:
    """Device tensors of one forward: views of ForwardBatch fields, never copies.

    Integer tensors are int32 or int64 (the kernels load either), one-dimensional and
    contiguous, unless a field says otherwise. ``bs = req_pool_indices.shape[0]``;
    ``num_tokens = input_ids.shape[0]`` (``== bs`` for ``DECODE``).

    Only *live* rows are checked or change canary state (:data:`.consts.PADDING_REQ_POOL_INDEX`
    says which rows are): a row with ``req_pool_indices[b] == 0`` is padding and is skipped
    entirely; a row past ``live_rows`` or repeating an earlier live row's ``req_pool_idx`` is
    reported once by the pre launch (``PADDED_ROW``) and otherwise skipped. ``extend_*`` are given
    for ``EXTEND`` and only then.

    Optional checks (None = off):

    - ``expected_input_ids`` / ``expected_positions``: int64 ``[num_tokens]``, the expected
      input token / position of every token (write-input assert); ``NO_EXPECTED_TOKEN`` (-1)
      in an entry means no expectation for that token.
    - ``token_history`` / ``token_history_lens`` (both or neither): int32 ``[R_h, L_h]`` (rows
      contiguous) and int64 ``[R_h]``, the known token of (request pool row, position);
      positions ``>= token_history_lens[row]`` are unknown. Indexed by *pool row*
      (``req_pool_indices[b]``), so persistent tensors serve every forward, graph replays too.
      With ``verify_token`` every verified slot's token is compared with it; it is also the
      write-input assert's fallback where ``expected_input_ids`` has no expectation.
    - ``host_seq_lens``: int64 ``[bs]``, on the device: the scheduler's host mirror of
      ``seq_lens`` (copied in before the forward); every live row must agree with ``seq_lens``.
    - ``live_rows``: int64 ``[1]``, on the device: how many of the ``bs`` rows the scheduler sent
      (copied in before the forward; a replayed CUDA graph's view has ``bs`` rows, the padded
      ones past ``live_rows``). None: every row is inside the batch.
    """

    layout: BatchLayout
    req_pool_indices: torch.Tensor  # [bs]
    seq_lens: torch.Tensor  # [bs]
    extend_prefix_lens: torch.Tensor | None  # [bs] EXTEND only
    extend_seq_lens: torch.Tensor | None  # [bs] EXTEND only
    extend_start_loc: torch.Tensor | None  # [bs] EXTEND only
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    out_cache_loc: torch.Tensor  # [num_tokens]: the slot each token's K/V is written to
    expected_input_ids: torch.Tensor | None = None  # int64 [num_tokens]
    expected_positions: torch.Tensor | None = None  # int64 [num_tokens]
    token_history: torch.Tensor | None = None  # int32 [R_h, L_h]
    token_history_lens: torch.Tensor | None = None  # int64 [R_h]
    verify_token: bool = True
    host_seq_lens: torch.Tensor | None = None  # int64 [bs]
    live_rows: torch.Tensor | None = None  # int64 [1]

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
        has_history = self.token_history is not None
        if has_history != (self.token_history_lens is not None):
            raise ValueError(
                "CanaryBatchView: token_history and token_history_lens are given together or "
                f"not at all (token_history given: {has_history})"
            )
        if has_history:
            history = _matrix(self, "token_history", torch.int32)
            _vector(self, "token_history_lens", (torch.int64,), length=history.shape[0])
        if not isinstance(self.verify_token, bool):
            raise TypeError(
                f"CanaryBatchView.verify_token must be a bool, got {self.verify_token!r}"
            )
        if self.host_seq_lens is not None:
            _vector(self, "host_seq_lens", (torch.int64,), length=bs)
        if self.live_rows is not None:
            _vector(self, "live_rows", (torch.int64,), length=1)
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

    @property
    def verifies_tokens(self) -> bool:
        """Whether verified slots are compared with the token history."""
        return self.token_history is not None and self.verify_token

    def with_expected_inputs(
        self, *, expected_input_ids: torch.Tensor, expected_positions: torch.Tensor
    ) -> CanaryBatchView:
        """This view with the write-input expectations set: the same as ``dataclasses.replace``
        with those two fields, but only they are validated (the rest of this view already was:
        the eager EXTEND path calls this once per forward, where a whole validation costs tens
        of µs of host time).

        Raises:
            TypeError / ValueError: an expectation is not an int64 ``[num_tokens]`` contiguous
                tensor on this view's device.
        """
        view = object.__new__(CanaryBatchView)
        for name in CanaryBatchView.__slots__:
            object.__setattr__(view, name, getattr(self, name))
        object.__setattr__(view, "expected_input_ids", expected_input_ids)
        object.__setattr__(view, "expected_positions", expected_positions)
        device = self.req_pool_indices.device
        for name in ("expected_input_ids", "expected_positions"):
            _on_device(view, name, _vector(view, name, (torch.int64,), length=self.num_tokens),
                       device)
        return view


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepEntries:
    """Slots a sweep checks, one entry each (int64 ``[n]`` tensors, contiguous, one device).

    - ``slots``: the slot to check (0: reported as unmapped).
    - ``prev_slots``: the slot of the previous position of the same history; -1 for position 0
      (the chain must equal ``CHAIN_ANCHOR``); 0 when unknown (the chain is not checked).
    - ``positions``: the position the slot must hold.
    - ``tokens``: the token the slot must hold, or ``NO_EXPECTED_TOKEN`` (not checked).
    """

    slots: torch.Tensor
    prev_slots: torch.Tensor
    positions: torch.Tensor
    tokens: torch.Tensor

    def __post_init__(self) -> None:
        count = _vector(self, "slots", (torch.int64,)).shape[0]
        for name in ("prev_slots", "positions", "tokens"):
            _vector(self, name, (torch.int64,), length=count)
        _same_device(self, self.slots.device)

    @property
    def count(self) -> int:
        return self.slots.shape[0]

    @property
    def device(self) -> torch.device:
        return self.slots.device


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedSlots:
    """Slots the host tier loaded back, one entry each (int64 ``[n]`` tensors, contiguous, one
    device): ``slots`` the device slot the KV was copied into (its record already restored),
    ``origins`` the device slot the host copy was taken from (whose ``partial`` window the
    restored fingerprint was taken at)."""

    slots: torch.Tensor
    origins: torch.Tensor

    def __post_init__(self) -> None:
        count = _vector(self, "slots", (torch.int64,)).shape[0]
        _vector(self, "origins", (torch.int64,), length=count)
        _same_device(self, self.slots.device)

    @property
    def count(self) -> int:
        return self.slots.shape[0]

    @property
    def device(self) -> torch.device:
        return self.slots.device


def check_same_device(*, state: CanaryDeviceState, device: torch.device, what: str) -> None:
    """Raise ``ValueError`` unless ``device`` (of the launch input ``what``) is the state's."""
    if device != state.device:
        raise ValueError(f"{what} is on {device} but CanaryDeviceState is on {state.device}")


# ----------------------------------------------------------------------------- token history


def check_scatter_inputs(
    *,
    flat_in: torch.Tensor,
    offsets: torch.Tensor,
    req_pool_indices: torch.Tensor,
    pool_out: torch.Tensor,
    history_lens: torch.Tensor | None,
    history_lens_out: torch.Tensor | None,
) -> tuple[int, int]:
    """Validate the inputs of the token-history scatter (its Triton launch and torch reference;
    contract in :mod:`.scatter_req_token_ids`): types, dtypes, shapes, layouts and devices, no
    values. Return ``(bs, T)``.

    Raises:
        TypeError: a tensor is missing or of the wrong dtype (names the argument).
        ValueError: a shape, layout or device is wrong (names the argument).
    """
    _check_pool_arguments(
        {
            "pool_out": (pool_out, torch.int32, 2),
            "flat_in": (flat_in, torch.int64, 1),
            "offsets": (offsets, torch.int64, 1),
            "req_pool_indices": (req_pool_indices, torch.int64, 1),
            "history_lens": (history_lens, torch.int64, 1),
            "history_lens_out": (history_lens_out, torch.int64, 1),
        },
        optional=("history_lens", "history_lens_out"),
    )
    batch_size = req_pool_indices.shape[0]
    num_tokens = flat_in.shape[0]
    if offsets.shape[0] != batch_size + 1:
        raise ValueError(
            f"offsets must have shape [bs + 1] = [{batch_size + 1}] for "
            f"req_pool_indices of shape [{batch_size}], got {tuple(offsets.shape)}"
        )
    if batch_size == 0 and num_tokens != 0:
        raise ValueError(
            f"flat_in has {num_tokens} tokens but req_pool_indices is empty (no row owns them)"
        )
    if history_lens is not None and history_lens.shape[0] != batch_size:
        raise ValueError(
            f"history_lens must have shape [bs] = [{batch_size}], got {tuple(history_lens.shape)}"
        )
    if history_lens_out is not None and history_lens_out.shape[0] != pool_out.shape[0]:
        raise ValueError(
            f"history_lens_out must have shape [R] = [{pool_out.shape[0]}] (pool_out's rows), "
            f"got {tuple(history_lens_out.shape)}"
        )
    return batch_size, num_tokens


def _check_pool_arguments(
    named: dict[str, tuple[torch.Tensor | None, torch.dtype, int]],
    *,
    optional: tuple[str, ...] = (),
) -> None:
    """Each ``name: (tensor, dtype, dims)`` is a tensor of that dtype and rank (1-D ones
    contiguous) on ``pool_out``'s device (the first entry); names in ``optional`` may be None.

    Raises:
        TypeError: not a tensor, or the wrong dtype (names the argument).
        ValueError: the wrong rank, a strided vector, another device (names the argument).
    """
    device = None
    for name, (tensor, dtype, dims) in named.items():
        if tensor is None and name in optional:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of dtype {dtype}, got {type(tensor)}")
        if tensor.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype}, got {tensor.dtype}")
        if tensor.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D, got shape {tuple(tensor.shape)}")
        if dims == 1 and not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got stride {tensor.stride()}")
        device = tensor.device if device is None else device
        if tensor.device != device:
            raise ValueError(
                f"{name} is on {tensor.device} but pool_out is on {device}; every tensor must "
                "be on pool_out's device"
            )


def check_append_history_inputs(
    *,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    tokens: torch.Tensor,
    pool_out: torch.Tensor,
    history_lens_out: torch.Tensor,
) -> int:
    """Validate the inputs of the sampled-token append (its Triton launch and torch reference;
    contract in :mod:`.append_history`): types, dtypes, shapes, layouts and devices, no values.
    Return the row count ``n`` (``tokens``' length).

    Raises:
        TypeError: a tensor is missing or of the wrong dtype (names the argument).
        ValueError: a shape, layout or device is wrong (names the argument).
    """
    _check_pool_arguments({
        "pool_out": (pool_out, torch.int32, 2),
        "history_lens_out": (history_lens_out, torch.int64, 1),
    })
    if history_lens_out.shape[0] != pool_out.shape[0]:
        raise ValueError(
            f"history_lens_out must have shape [R] = [{pool_out.shape[0]}] (pool_out's rows), "
            f"got {tuple(history_lens_out.shape)}"
        )
    rows = None
    for name, tensor in (("tokens", tokens), ("req_pool_indices", req_pool_indices),
                         ("seq_lens", seq_lens)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor)}")
        if tensor.dtype not in _INDEX_DTYPES:
            raise TypeError(f"{name} must be torch.int32 or torch.int64, got {tensor.dtype}")
        rows = tensor.shape[0] if rows is None else rows
        if tensor.dim() != 1 or tensor.shape[0] != rows:
            raise ValueError(
                f"{name} must be 1-D with tokens' length {rows}, got shape {tuple(tensor.shape)}"
            )
        if rows > 1 and tensor.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous, got stride {tensor.stride()}")
        if tensor.device != pool_out.device:
            raise ValueError(
                f"{name} is on {tensor.device} but pool_out is on {pool_out.device}; every "
                "tensor must be on pool_out's device"
            )
    return rows


def check_publish_inputs(*, counters: torch.Tensor) -> None:
    """Validate the input of the counter publication (its Triton launch and torch reference;
    contract in :mod:`.publish_counters`).

    Raises:
        TypeError: ``counters`` is not an int64 tensor.
        ValueError: ``counters`` is not a contiguous ``[NUM_COUNTERS]`` vector.
    """
    if not isinstance(counters, torch.Tensor) or counters.dtype != torch.int64:
        got = counters.dtype if isinstance(counters, torch.Tensor) else type(counters).__name__
        raise TypeError(f"counters must be an int64 torch.Tensor, got {got}")
    if tuple(counters.shape) != (NUM_COUNTERS,) or not counters.is_contiguous():
        raise ValueError(
            f"counters must be a contiguous [{NUM_COUNTERS}] vector (NUM_COUNTERS), got shape "
            f"{tuple(counters.shape)} and stride {counters.stride()}"
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
    _check_matrix(owner, name, tensor, dtype, contiguous=contiguous)
    return tensor


def _check_matrix(
    owner: object, name: str, tensor: object, dtype: torch.dtype, *, contiguous: bool = False
) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{type(owner).__name__}.{name} must be a torch.Tensor, got {tensor!r}")
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


def _on_device(owner: object, name: str, tensor: torch.Tensor, device: torch.device) -> None:
    if tensor.device != device:
        raise ValueError(
            f"{type(owner).__name__}.{name} is on {tensor.device}, expected {device} "
            "(all tensors on one device)"
        )


def _same_device(owner: object, device: torch.device) -> None:
    for name in owner.__slots__:  # type: ignore[attr-defined]
        value = getattr(owner, name)
        if isinstance(value, torch.Tensor):
            _on_device(owner, name, value, device)


MAX_ORACLE_VOCAB_SIZE = (1 << 31) - 1  # oracle tokens are int32


def check_hash_oracle_inputs(
    *,
    req_ids: torch.Tensor,
    bootstrap_room_ids: torch.Tensor | None,
    positions: torch.Tensor,
    vocab_size: int,
    tokens_out: torch.Tensor,
    positions_out: torch.Tensor | None,
) -> None:
    """Raise unless the arguments meet the contract of :mod:`.hash_oracle` (no host sync).

    Raises:
        TypeError: a dtype is not allowed (names the argument, its dtype, what is allowed).
        ValueError: a tensor is not 1-D of ``tokens_out``'s length, the tensors are on more
            than one device, or ``vocab_size`` is out of range.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not (
        1 <= vocab_size <= MAX_ORACLE_VOCAB_SIZE
    ):
        raise ValueError(
            f"vocab_size={vocab_size!r} is invalid; allowed: [1, {MAX_ORACLE_VOCAB_SIZE}]"
        )
    allowed = {
        "req_ids": (torch.int64,),
        "bootstrap_room_ids": (torch.int64,),
        "positions": (torch.int32, torch.int64),
        "tokens_out": (torch.int32, torch.int64),
        "positions_out": (torch.int64,),
    }
    tensors = {
        "req_ids": req_ids,
        "bootstrap_room_ids": bootstrap_room_ids,
        "positions": positions,
        "tokens_out": tokens_out,
        "positions_out": positions_out,
    }
    n = tokens_out.shape[0] if tokens_out.dim() == 1 else None
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if tensor.dtype not in allowed[name]:
            names = " or ".join(str(dtype) for dtype in allowed[name])
            raise TypeError(f"{name} must be {names}, got {tensor.dtype}")
        if tensor.dim() != 1 or tensor.shape[0] != n:
            raise ValueError(
                f"{name} must be 1-D with tokens_out's length "
                f"{'(tokens_out is not 1-D)' if n is None else n}, got shape {tuple(tensor.shape)}"
            )
        if tensor.device != tokens_out.device:
            raise ValueError(
                f"{name} is on {tensor.device} but tokens_out is on {tokens_out.device}"
            )


def check_admission_inputs(
    *,
    state: CanaryDeviceState,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    chains: torch.Tensor,
) -> None:
    """Raise unless the arguments meet the contract of :mod:`.admission_owner` (no host sync).

    Raises:
        TypeError: a tensor is not int64 (names it and its dtype).
        ValueError: a tensor is not 1-D and contiguous, the three differ in length, or one is
            not on the state's device.
    """
    tensors = {
        "req_pool_indices": req_pool_indices, "prefix_lens": prefix_lens, "chains": chains,
    }
    for name, tensor in tensors.items():
        if tensor.dtype != torch.int64:
            raise TypeError(f"{name} has dtype {tensor.dtype}; allowed: torch.int64")
        if tensor.dim() != 1 or not tensor.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous 1-D tensor, got shape {tuple(tensor.shape)} and "
                f"strides {tensor.stride()}"
            )
        if tensor.shape[0] != req_pool_indices.shape[0]:
            raise ValueError(
                f"{name} has {tensor.shape[0]} entries but req_pool_indices has "
                f"{req_pool_indices.shape[0]}"
            )
        check_same_device(state=state, device=tensor.device, what=name)


def check_accepted_owner_inputs(
    *,
    state: CanaryDeviceState,
    req_pool_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_lens: torch.Tensor,
    block: int,
) -> None:
    """Raise unless the arguments meet the contract of :mod:`.accepted_owner` (no host sync).

    Raises:
        TypeError: a tensor has a dtype outside the contract, or ``block`` is not an int.
        ValueError: ``block < 1``, a tensor is not 1-D and contiguous, the lengths disagree, or a
            tensor is not on the state's device.
    """
    if not isinstance(block, int) or isinstance(block, bool):
        raise TypeError(f"block must be an int, got {type(block).__name__}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    allowed = {
        "req_pool_indices": (req_pool_indices, _INDEX_DTYPES),
        "out_cache_loc": (out_cache_loc, _INDEX_DTYPES),
        "accept_lens": (accept_lens, _INDEX_DTYPES),
    }
    for name, (tensor, dtypes) in allowed.items():
        if tensor.dtype not in dtypes:
            names = " or ".join(str(dtype) for dtype in dtypes)
            raise TypeError(f"{name} has dtype {tensor.dtype}; allowed: {names}")
        if tensor.dim() != 1 or not tensor.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous 1-D tensor, got shape {tuple(tensor.shape)} and "
                f"strides {tensor.stride()}"
            )
        check_same_device(state=state, device=tensor.device, what=name)
    rows = req_pool_indices.shape[0]
    if accept_lens.shape[0] != rows:
        raise ValueError(
            f"accept_lens has {accept_lens.shape[0]} entries but req_pool_indices has {rows}"
        )
    if out_cache_loc.shape[0] != rows * block:
        raise ValueError(
            f"out_cache_loc has {out_cache_loc.shape[0]} entries but {rows} rows of block "
            f"{block} need {rows * block}"
        )
