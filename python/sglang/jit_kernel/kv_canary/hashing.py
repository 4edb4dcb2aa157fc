"""64-bit mixing shared by the token oracle, the chain rule and the real-data fingerprint.

Each definition exists as a scalar pure-Python function (the reference) and a torch function;
the Triton device-function forms are in :mod:`.triton_helpers`; ``mix64`` and ``chain_after``
also have numpy forms for the host (a request's owner chain at admission):

- ``mix64``: the SplitMix64 finalizer.
- ``chain_term(token, position)``: the 40-bit term of the additive chain rule (see
  :mod:`.consts`): ``mix64((token << 32) ^ position ^ CHAIN_SALT) >> 24`` on the unsigned 64-bit
  patterns of ``token`` and ``position``. Callers pass the token's low 32 bits.
- ``chain_after``: ``CHAIN_ANCHOR + sum(chain_term(t_q & TOKEN_MASK, q))`` over a history: the
  chain value of the position after it, which is also what ``owner_chains`` holds for a request
  whose KV cache holds exactly that history.
- the fingerprint of a slot. Source ``s`` (of ``L`` real-data sources) folds to ``v_s``, the
  XOR over its selected columns ``c`` of ``mix64(word[s][slot, c] ^ fingerprint_key(s, c))``
  with ``fingerprint_key(s, c) = mix64(((s << 32) | c) ^ FINGERPRINT_SALT)``. ``all`` selects
  every column of a source and the fingerprint is the XOR of the ``v_s`` (0 with no sources):
  every term is a bijection of its word, so changing any single word always changes it.
  ``partial`` selects the two columns ``c0, c0 + 1`` with ``c0 = 2 * (slot mod (words_per_row
  // 2))`` (16 bytes per source, rotating over the row with the slot, so that different heads
  and offsets are covered across slots), and the fingerprint keeps one **lane** per source:
  bits ``[s * W, (s + 1) * W)`` hold the top ``W = 64 // L`` bits of ``v_s`` (16 bits with
  SGLang's four rows), so one source can be checked without reading the others (see
  :func:`due_source_scalar`); a changed word goes unseen with probability ``2**-W``. A slot
  outside a source's rows folds zero words (and rotates as slot 0).
- the **landing window** and **landing poison** of a slot (real data on: the pre launch writes
  the poison into the window of every slot the forward is to write, the post launch requires
  the model to have replaced it): per source, the columns ``c0, c0 + 1`` of the ``partial``
  fingerprint (column 0 alone for a one-word row), and there word ``c`` holds
  ``mix64((slot ^ ((S + 1) << LANDING_STEP_SHIFT)) ^ LANDING_SALT) ^ fingerprint_key(s, c)`` in
  the forward with step ``S``: 128 bits per source that no K/V the model writes matches but with
  probability ``2**-128``, different per slot, source, column and forward.
- the checksum of a counter publication (:mod:`.publish_counters`): ``CHECKSUM_BASE +
  sum(counters[i] * CHECKSUM_KEYS[i])`` over the words before ``COUNTER_CHECKSUM``, with
  ``CHECKSUM_KEYS[i] = ((i + 1) * CHECKSUM_MULTIPLIER) | 1``, in wrapping int64; a scalar form
  and the numpy check the host runs on each copy it reads (:func:`counters_checksum_holds`).
- the source a ``partial`` verify reads (:func:`due_source_scalar`): at prefix position ``p``
  in the forward with step ``S`` and verify stride ``N``, the position is due when ``(p + S) %
  N == 0``, and then only source ``((p + S) // N) % L`` is read and its lane compared: one
  16-byte load per slot and forward instead of ``L``, every source of a slot in ``L`` of its
  due forwards.

All torch functions here take and return ``torch.int64`` tensors but compute with unsigned 64-bit
semantics: right shifts are logical and multiplications wrap modulo 2**64 (two's complement int64
multiplication wraps the same bits). They run on any device, allocate only their outputs and
temporaries, and never synchronize with the host, so they are CUDA-graph capturable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from sglang.jit_kernel.kv_canary.consts import (
    CHAIN_ANCHOR,
    CHAIN_SALT,
    CHAIN_TERM_BITS,
    CHECKSUM_BASE,
    CHECKSUM_MULTIPLIER,
    COUNTER_CHECKSUM,
    FINGERPRINT_SALT,
    LANDING_SALT,
    LANDING_STEP_SHIFT,
    TOKEN_MASK,
)

U64_MASK = (1 << 64) - 1
MIX64_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
MIX64_MULTIPLIER_2 = 0x94D049BB133111EB


def to_signed_i64(value: int) -> int:
    """Reinterpret the low 64 bits of ``value`` as a signed int64."""
    value &= U64_MASK
    return value - (1 << 64) if value >= (1 << 63) else value


CHECKSUM_KEYS: tuple[int, ...] = tuple(
    to_signed_i64(((index + 1) * CHECKSUM_MULTIPLIER) | 1) for index in range(COUNTER_CHECKSUM)
)
_CHECKSUM_KEYS_ARRAY = np.array(CHECKSUM_KEYS, dtype=np.int64)


def counters_checksum(words: Sequence[int]) -> int:
    """The checksum of a counter publication (scalar form): what the publish launch stores at
    ``COUNTER_CHECKSUM`` for ``words`` (the ``COUNTER_CHECKSUM`` words before it are read)."""
    total = CHECKSUM_BASE + sum(
        word * key for word, key in zip(words[:COUNTER_CHECKSUM], CHECKSUM_KEYS, strict=True)
    )
    return to_signed_i64(total)


def counters_checksum_holds(words: np.ndarray) -> bool:
    """Whether int64 ``words`` (``[NUM_COUNTERS]``) carry their own checksum: the numpy form of
    :func:`counters_checksum`, one wrapping dot product (numpy integer arithmetic wraps)."""
    summed = int(np.dot(words[:COUNTER_CHECKSUM], _CHECKSUM_KEYS_ARRAY))
    return (summed + CHECKSUM_BASE - int(words[COUNTER_CHECKSUM])) & U64_MASK == 0


def to_unsigned_u64(value: int) -> int:
    """Reinterpret a signed int64 (or any int) as its unsigned 64-bit pattern."""
    return value & U64_MASK


def require_int64_same_shape(
    first: tuple[str, torch.Tensor], second: tuple[str, torch.Tensor]
) -> None:
    """Raise unless both named tensors are int64 and of one shape (no host sync).

    Raises:
        TypeError: a tensor is not int64 (names it and its dtype).
        ValueError: the shapes differ (names both).
    """
    for name, tensor in (first, second):
        if tensor.dtype != torch.int64:
            raise TypeError(f"{name} must be int64, got {tensor.dtype}")
    if first[1].shape != second[1].shape:
        raise ValueError(
            f"{first[0]} {tuple(first[1].shape)} and {second[0]} {tuple(second[1].shape)} "
            f"differ in shape"
        )


# ----------------------------------------------------------------------------- scalar reference

def mix64_scalar(value: int) -> int:
    """SplitMix64 finalizer on the unsigned 64-bit pattern of ``value``; returns an unsigned int."""
    x = value & U64_MASK
    x ^= x >> 30
    x = (x * MIX64_MULTIPLIER_1) & U64_MASK
    x ^= x >> 27
    x = (x * MIX64_MULTIPLIER_2) & U64_MASK
    x ^= x >> 31
    return x


def chain_term_scalar(token: int, position: int) -> int:
    """Chain-rule term of one (token, position) pair: an unsigned int below ``2**40``."""
    return mix64_scalar((token << 32) ^ position ^ CHAIN_SALT) >> (64 - CHAIN_TERM_BITS)


def chain_after_scalar(*, tokens: Sequence[int]) -> int:
    """``CHAIN_ANCHOR + sum(chain_term(t_q & TOKEN_MASK, q))`` over positions ``q = 0..`` of
    ``tokens``, as a signed int64: the chain value of position ``len(tokens)``."""
    chain = CHAIN_ANCHOR
    for position, token in enumerate(tokens):
        chain += chain_term_scalar(token & TOKEN_MASK, position)
    return to_signed_i64(chain)


# ----------------------------------------------------------------------------- numpy (host)

_U64_CHAIN_SALT = np.uint64(CHAIN_SALT)
_CHAIN_OF_NOTHING = to_signed_i64(CHAIN_ANCHOR)
_U64_TOKEN_MASK = np.uint64(TOKEN_MASK)


def mix64_numpy(x: np.ndarray) -> np.ndarray:
    """:func:`mix64_scalar` elementwise on a uint64 array, in place (returns ``x``)."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(MIX64_MULTIPLIER_1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(MIX64_MULTIPLIER_2)
    x ^= x >> np.uint64(31)
    return x


def chain_after_numpy(tokens: np.ndarray) -> int:
    """:func:`chain_after_scalar` of an int64 (or uint64) array ``[n]``, vectorized on the host
    (``tokens`` is not modified): about 5 ns per token plus what building ``tokens`` from a list
    costs, and nothing for an empty array (the chain of position 0, ``CHAIN_ANCHOR``: a request
    with no cached prefix, whose ten numpy calls cost more than the rest of its admission)."""
    if tokens.ndim != 1 or tokens.dtype not in (np.int64, np.uint64):
        raise TypeError(f"chain_after_numpy expects a 1-D int64 array, got {tokens.dtype} "
                        f"{tokens.shape}")
    if tokens.shape[0] == 0:
        return _CHAIN_OF_NOTHING
    x = tokens.view(np.uint64) & _U64_TOKEN_MASK  # a new array
    x <<= np.uint64(32)
    x ^= np.arange(x.shape[0], dtype=np.uint64)
    x ^= _U64_CHAIN_SALT
    terms = mix64_numpy(x) >> np.uint64(64 - CHAIN_TERM_BITS)
    return to_signed_i64(CHAIN_ANCHOR + int(terms.sum(dtype=np.uint64)))


def fingerprint_key_scalar(*, source: int, column: int) -> int:
    """Key of word ``column`` of real-data source ``source``: an unsigned int."""
    return mix64_scalar(((source << 32) | column) ^ FINGERPRINT_SALT)


def fingerprint_columns(*, slot: int, words_per_row: int, num_rows: int, partial: bool) -> range:
    """Columns of a source that a slot's fingerprint folds (see the module docstring).

    Raises:
        ValueError: ``partial`` with fewer than 2 words per row.
    """
    if not partial:
        return range(words_per_row)
    if words_per_row < 2:
        raise ValueError(f"partial fingerprints need words_per_row >= 2, got {words_per_row}")
    rotation_slot = slot if 0 <= slot < num_rows else 0
    first = 2 * (rotation_slot % (words_per_row // 2))
    return range(first, first + 2)


def landing_columns(*, slot: int, words_per_row: int, num_rows: int) -> range:
    """Columns of a source that hold a slot's landing poison (see the module docstring)."""
    if words_per_row < 2:
        return range(words_per_row)
    return fingerprint_columns(slot=slot, words_per_row=words_per_row, num_rows=num_rows,
                               partial=True)


def landing_poison_scalar(*, slot: int, step: int, source: int, column: int) -> int:
    """The landing poison of word ``column`` of source ``source`` of ``slot`` in the forward with
    step ``step``: an unsigned int."""
    base = mix64_scalar((slot ^ ((step + 1) << LANDING_STEP_SHIFT)) ^ LANDING_SALT)
    return base ^ fingerprint_key_scalar(source=source, column=column)


def fingerprint_lane_bits(num_sources: int) -> int:
    """``W``: the bits of each source's lane in a ``partial`` fingerprint (``64 // num_sources``).

    Raises:
        ValueError: ``num_sources`` is not in ``[1, 64]``.
    """
    if not 1 <= num_sources <= 64:
        raise ValueError(f"num_sources must be in [1, 64], got {num_sources}")
    return 64 // num_sources


def lane_mask_scalar(*, source: int, num_sources: int) -> int:
    """The bits of source ``source``'s lane, as a signed int64."""
    bits = fingerprint_lane_bits(num_sources)
    return to_signed_i64(((1 << bits) - 1) << (source * bits))


def due_source_scalar(*, position: int, step: int, stride: int, num_sources: int) -> int | None:
    """The source whose lane a ``partial`` post verify checks at prefix ``position`` in the
    forward with step ``step`` (verify stride ``stride``), or None when the position is not due
    (see the module docstring)."""
    if (position + step) % stride:
        return None
    return (position + step) // stride % num_sources


def fingerprint_scalar(*, words: Iterable[tuple[int, int, int]]) -> int:
    """XOR of ``mix64(word ^ fingerprint_key(source, column))`` over ``(source, column, word)``
    triples (words as int64 or unsigned patterns); an unsigned int, 0 for no words."""
    result = 0
    for source, column, word in words:
        result ^= mix64_scalar(word ^ fingerprint_key_scalar(source=source, column=column))
    return result


def slot_fingerprint_scalar(*, slot: int, sources: Sequence[Sequence[Sequence[int]]],
                            partial: bool) -> int:
    """Fingerprint of ``slot`` over real-data sources given as row lists (``sources[s][row]`` is
    the list of int64 words of that row); an unsigned int (lanes with ``partial``)."""
    result = 0
    for source, rows in enumerate(sources):
        words_per_row = len(rows[0]) if rows else 0
        inside = 0 <= slot < len(rows)
        columns = fingerprint_columns(
            slot=slot, words_per_row=words_per_row, num_rows=len(rows), partial=partial
        )
        folded = fingerprint_scalar(
            words=[(source, c, rows[slot][c] if inside else 0) for c in columns]
        )
        if partial:
            bits = fingerprint_lane_bits(len(sources))
            result |= (folded >> (64 - bits)) << (source * bits)
        else:
            result ^= folded
    return result


# ----------------------------------------------------------------------------- torch (int64)

_M1_SIGNED = to_signed_i64(MIX64_MULTIPLIER_1)
_M2_SIGNED = to_signed_i64(MIX64_MULTIPLIER_2)


def logical_shift_right(x: torch.Tensor, shift: int) -> torch.Tensor:
    """``x >> shift`` on the unsigned bit pattern of an int64 tensor (0 < shift < 64)."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def mix64_torch(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finalizer, elementwise, on an int64 tensor (unsigned semantics).

    Args:
        x: int64 tensor of any shape and device.
    Returns:
        int64 tensor, same shape; bit-identical to :func:`mix64_scalar` on each element.
    """
    if x.dtype != torch.int64:
        raise TypeError(f"mix64_torch expects int64, got {x.dtype}")
    x = x ^ logical_shift_right(x, 30)
    x = x * _M1_SIGNED
    x = x ^ logical_shift_right(x, 27)
    x = x * _M2_SIGNED
    x = x ^ logical_shift_right(x, 31)
    return x


_CHAIN_SALT_SIGNED = to_signed_i64(CHAIN_SALT)
_TWO_POW_32 = 1 << 32


def chain_term_torch(token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Chain-rule term, elementwise over broadcast int64 tensors; values in ``[0, 2**40)``.

    Bit-identical to :func:`chain_term_scalar`. ``token * 2**32`` wraps like ``token << 32``.
    """
    if token.dtype != torch.int64 or position.dtype != torch.int64:
        raise TypeError(
            f"chain_term_torch expects int64 token and position, got {token.dtype} and "
            f"{position.dtype}"
        )
    mixed = mix64_torch((token * _TWO_POW_32) ^ position ^ _CHAIN_SALT_SIGNED)
    return logical_shift_right(mixed, 64 - CHAIN_TERM_BITS)


def chain_terms_torch(*, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``chain_term(tokens & TOKEN_MASK, positions)`` elementwise (int64, broadcast)."""
    return chain_term_torch(tokens & TOKEN_MASK, positions)


def chain_before_torch(*, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Chain value at each token of histories ``[..., n]``: ``CHAIN_ANCHOR`` plus the exclusive
    prefix sum of the chain terms over the last dimension (int64 ``[..., n]``)."""
    terms = chain_terms_torch(tokens=tokens, positions=positions)
    return CHAIN_ANCHOR + torch.cumsum(terms, dim=-1) - terms


def chain_after_torch(*, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``CHAIN_ANCHOR + sum(chain_term(t & TOKEN_MASK, q))`` over the last dimension of
    histories ``[..., n]`` (int64 ``[...]``): the chain value of the position after each
    history, i.e. the ``owner_chains`` value of a request whose KV cache holds it."""
    return CHAIN_ANCHOR + chain_terms_torch(tokens=tokens, positions=positions).sum(dim=-1)


def fingerprint_keys_torch(*, source: int, columns: torch.Tensor) -> torch.Tensor:
    """``fingerprint_key(source, c)`` for every ``c`` of the int64 tensor ``columns``."""
    return mix64_torch(((source << 32) | columns) ^ to_signed_i64(FINGERPRINT_SALT))


def fingerprint_fold_torch(*, words: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """XOR over the last dimension of ``mix64(words ^ keys)`` (int64, ``keys`` broadcast to
    ``words [..., n]``); int64 ``[...]``, 0 where ``n == 0``."""
    if words.dtype != torch.int64 or keys.dtype != torch.int64:
        raise TypeError(
            f"fingerprint_fold_torch expects int64 words and keys, got {words.dtype}, {keys.dtype}"
        )
    return _xor_reduce_last_dim(mix64_torch(words ^ keys))


def slot_fingerprints_torch(
    *, slots: torch.Tensor, sources: Sequence[torch.Tensor], partial: bool,
    source_rows: Sequence[torch.Tensor | None] | None = None, windowed_sources: int = 0,
    rotations: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fingerprints of ``slots`` (int64 ``[n]``) over real-data sources (int64 word views
    ``[num_rows, words_per_row]``, row = slot); int64 ``[n]``, bit-identical to
    :func:`slot_fingerprint_scalar` (lanes with ``partial``). Slots outside a source's rows fold
    zero words. ``source_rows[k]`` (int64 ``[n]``, where given and not None) replaces ``slots``
    as the rows read from source ``k`` (a source indexed by another slot space). Without
    ``partial`` and with ``windowed_sources`` (a bit mask) nonzero, the fold splits into two
    halves: the top 32 bits of the other sources' XOR in bits ``[0, 32)``, the windowed sources'
    in ``[32, 64)``. ``rotations`` (int64 ``[n]``, where given) replaces the slot whose value
    places a ``partial`` window (``2 * (rotation mod (words_per_row // 2))``; a rotation outside
    the source's rows, or a slot outside them, places it as slot 0): a loaded slot's bytes are
    checked against the fingerprint taken at the slot it was copied from.

    Graph-safe (gathers with clamped indices, no host sync); allocates temporaries.
    """
    if slots.dtype != torch.int64:
        raise TypeError(f"slots must be int64, got {slots.dtype}")
    result = torch.zeros_like(slots)
    windowed = torch.zeros_like(slots)
    for source, words in enumerate(sources):
        num_rows, words_per_row = words.shape
        picked = slots
        if source_rows is not None and source_rows[source] is not None:
            picked = source_rows[source]
        inside = (picked >= 0) & (picked < num_rows)
        rows = torch.where(inside, picked, 0)
        if partial:
            placed = rows
            if rotations is not None:
                placed = torch.where(inside & (rotations >= 0) & (rotations < num_rows),
                                     rotations, 0)
            first = 2 * (placed % (words_per_row // 2))
            columns = torch.stack([first, first + 1], dim=-1)
        else:
            columns = torch.arange(words_per_row, dtype=torch.int64, device=slots.device)
            columns = columns.expand(slots.shape[0], words_per_row)
        gathered = words[rows[:, None], columns] if num_rows else torch.zeros_like(columns)
        gathered = torch.where(inside[:, None], gathered, 0)
        keys = fingerprint_keys_torch(source=source, columns=columns)
        folded = fingerprint_fold_torch(words=gathered, keys=keys)
        if partial:  # the top W bits into lane `source` (the multiply wraps like a shift)
            bits = fingerprint_lane_bits(len(sources))
            top = folded if bits == 64 else logical_shift_right(folded, 64 - bits)
            result |= top * (1 << (source * bits))
        elif windowed_sources >> source & 1:
            windowed ^= folded
        else:
            result ^= folded
    if not partial and windowed_sources:
        result = logical_shift_right(result, 32) | (logical_shift_right(windowed, 32) << 32)
    return result


def landing_columns_torch(*, slots: torch.Tensor, words_per_row: int,
                          num_rows: int) -> torch.Tensor:
    """int64 ``[n, 2]``: the landing columns of ``slots`` (:func:`landing_columns`; a one-word
    row repeats column 0)."""
    if words_per_row < 2:
        return torch.zeros((slots.shape[0], 2), dtype=torch.int64, device=slots.device)
    rows = torch.where((slots >= 0) & (slots < num_rows), slots, 0)
    first = 2 * (rows % (words_per_row // 2))
    return torch.stack([first, first + 1], dim=-1)


def landing_poison_torch(*, slots: torch.Tensor, step: int, source: int,
                         columns: torch.Tensor) -> torch.Tensor:
    """int64 ``columns``-shaped: :func:`landing_poison_scalar` of ``slots [n]`` (broadcast over
    ``columns [n, k]``)."""
    step_bits = to_signed_i64(((step + 1) << LANDING_STEP_SHIFT) & U64_MASK)
    mixed = mix64_torch((slots ^ step_bits) ^ LANDING_SALT)
    return mixed[:, None] ^ fingerprint_keys_torch(source=source, columns=columns)


def lane_masks_torch(*, sources: torch.Tensor, num_sources: int) -> torch.Tensor:
    """:func:`lane_mask_scalar` of every source index in the int64 tensor ``sources``."""
    masks = [lane_mask_scalar(source=s, num_sources=num_sources) for s in range(num_sources)]
    return torch.tensor(masks, dtype=torch.int64, device=sources.device)[sources]


def due_sources_torch(
    *, positions: torch.Tensor, step: int, stride: int, num_sources: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`due_source_scalar` of every position of the int64 tensor ``positions``
    (non-negative): ``(due, source)``, bool and int64 (``source`` is meaningful where due)."""
    shifted = positions + step
    return shifted % stride == 0, shifted // stride % num_sources


def _xor_reduce_last_dim(x: torch.Tensor) -> torch.Tensor:
    """XOR of the last dimension of an integer tensor (0 for an empty last dimension)."""
    if x.shape[-1] == 0:
        return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        folded = x[..., :half] ^ x[..., half : 2 * half]
        x = torch.cat([folded, x[..., 2 * half :]], dim=-1) if x.shape[-1] % 2 else folded
    return x[..., 0]


def unsigned_mod_torch(x: torch.Tensor, modulus: int) -> torch.Tensor:
    """``u64(x) % modulus`` for an int64 tensor ``x`` and ``1 <= modulus < 2**62``.

    Splits the unsigned value into its high and low 32-bit halves so no intermediate leaves
    the non-negative int64 range.
    """
    if not 1 <= modulus < (1 << 62):
        raise ValueError(f"modulus must be in [1, 2**62), got {modulus}")
    high = logical_shift_right(x, 32)  # < 2**32
    low = x & 0xFFFFFFFF  # < 2**32
    two32_mod = (1 << 32) % modulus
    # (high * 2**32 + low) mod m == ((high mod m) * (2**32 mod m) + low) mod m
    # high mod m < m < 2**62 and 2**32 mod m < 2**32: split once more to stay below 2**63.
    high_mod = high % modulus
    product = _mulmod(high_mod, two32_mod, modulus)
    return (product + low % modulus) % modulus


def _mulmod(a: torch.Tensor, b: int, modulus: int) -> torch.Tensor:
    """``(a * b) % modulus`` for non-negative ``a < modulus`` and ``0 <= b < 2**32``."""
    if modulus <= (1 << 31):
        return (a * b) % modulus  # a < 2**31, b < 2**32: product < 2**63
    result = torch.zeros_like(a)
    addend = a
    remaining = b
    while remaining:  # python-level loop over the bits of a constant: fixed, graph-safe
        if remaining & 1:
            result = (result + addend) % modulus
        addend = (addend * 2) % modulus
        remaining >>= 1
    return result
