"""64-bit mixing shared by the token oracle, the chain rule and the real-data fingerprint.

Three definitions live here, each in a scalar pure-Python form (the reference) and a torch
form; the Triton device-function forms are in :mod:`.triton_hashing`:

- ``mix64``: the SplitMix64 finalizer.
- ``chain_term(token, position)``: the 40-bit term of the additive chain rule (see
  :mod:`.consts`): ``mix64((token << 32) ^ position ^ CHAIN_SALT) >> 24`` on the unsigned 64-bit
  patterns of ``token`` and ``position``.
- ``fingerprint(words)``: an order-sensitive fold of a slot's real K words,
  ``XOR over i of mix64(word_i ^ mix64(i ^ FINGERPRINT_SALT))`` (0 for no words). Every term is a
  bijection of its word, so changing any single word always changes the fingerprint.

All torch functions here take and return ``torch.int64`` tensors but compute with unsigned
64-bit semantics: right shifts are logical and multiplications wrap modulo 2**64 (two's
complement int64 multiplication wraps the same bits). They run on any device, allocate only
their outputs, and never synchronize, so they are CUDA-graph capturable.

The scalar functions are the pure-Python references the torch versions are tested against bit
for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang.jit_kernel.kv_canary.consts import CHAIN_SALT, CHAIN_TERM_BITS, FINGERPRINT_SALT

U64_MASK = (1 << 64) - 1
MIX64_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
MIX64_MULTIPLIER_2 = 0x94D049BB133111EB


def to_signed_i64(value: int) -> int:
    """Reinterpret the low 64 bits of ``value`` as a signed int64."""
    value &= U64_MASK
    return value - (1 << 64) if value >= (1 << 63) else value


def to_unsigned_u64(value: int) -> int:
    """Reinterpret a signed int64 (or any int) as its unsigned 64-bit pattern."""
    return value & U64_MASK


def require_int64_same_shape(first: tuple[str, torch.Tensor], second: tuple[str, torch.Tensor]) -> None:
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


def fingerprint_scalar(words: Sequence[int]) -> int:
    """Fingerprint of a slot's real K words (int64 or unsigned patterns); an unsigned int."""
    result = 0
    for index, word in enumerate(words):
        result ^= mix64_scalar(word ^ mix64_scalar(index ^ FINGERPRINT_SALT))
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


def _fingerprint_keys_torch(num_words: int, *, device: torch.device | str) -> torch.Tensor:
    """int64 ``[num_words]``: the per-index keys ``mix64(i ^ FINGERPRINT_SALT)``."""
    index = torch.arange(num_words, dtype=torch.int64, device=device)
    return mix64_torch(index ^ to_signed_i64(FINGERPRINT_SALT))


def fingerprint_torch(words: torch.Tensor) -> torch.Tensor:
    """Fingerprint over the last dimension of an int64 tensor ``[..., num_words]``.

    Returns int64 ``[...]``, bit-identical to :func:`fingerprint_scalar` on each row (0 where
    ``num_words == 0``). Graph-safe: a fixed number of elementwise ops and a pairwise XOR tree.
    """
    if words.dtype != torch.int64:
        raise TypeError(f"fingerprint_torch expects int64 words, got {words.dtype}")
    terms = mix64_torch(words ^ _fingerprint_keys_torch(words.shape[-1], device=words.device))
    return _xor_reduce_last_dim(terms)


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
