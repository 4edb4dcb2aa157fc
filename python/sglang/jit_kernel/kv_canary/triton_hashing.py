"""Triton device-function forms of :mod:`.hashing` (``mix64``, ``chain_term``, ``fingerprint``).

They are bit-identical to the scalar and torch forms there (pinned by a test). Arithmetic runs
on ``tl.uint64`` bitcasts so right shifts are logical and multiplications wrap modulo 2**64;
inputs and outputs are ``tl.int64`` (the dtype of every canary buffer).
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary.consts import CHAIN_SALT, CHAIN_TERM_BITS, FINGERPRINT_SALT
from sglang.jit_kernel.kv_canary.hashing import MIX64_MULTIPLIER_1, MIX64_MULTIPLIER_2

_M1 = tl.constexpr(MIX64_MULTIPLIER_1)
_M2 = tl.constexpr(MIX64_MULTIPLIER_2)
_CHAIN_SALT = tl.constexpr(CHAIN_SALT)
_CHAIN_TERM_SHIFT = tl.constexpr(64 - CHAIN_TERM_BITS)
_FINGERPRINT_SALT = tl.constexpr(FINGERPRINT_SALT)


@triton.jit
def mix64_u64(x):
    """SplitMix64 finalizer on a ``tl.uint64`` tensor."""
    x ^= x >> 30
    x *= _M1
    x ^= x >> 27
    x *= _M2
    x ^= x >> 31
    return x


@triton.jit
def mix64(x):
    """SplitMix64 finalizer on an int64 tensor (unsigned semantics); returns int64."""
    return mix64_u64(x.to(tl.uint64, bitcast=True)).to(tl.int64, bitcast=True)


@triton.jit
def chain_term(token, position):
    """Chain-rule term of int64 (token, position) tensors; int64 values in ``[0, 2**40)``."""
    token_u = token.to(tl.int64).to(tl.uint64, bitcast=True)
    position_u = position.to(tl.int64).to(tl.uint64, bitcast=True)
    mixed = mix64_u64((token_u << 32) ^ position_u ^ _CHAIN_SALT)
    return (mixed >> _CHAIN_TERM_SHIFT).to(tl.int64)


@triton.jit
def fingerprint_term(word, index):
    """One word's contribution ``mix64(word ^ mix64(index ^ FINGERPRINT_SALT))``; int64."""
    key = mix64_u64(index.to(tl.int64).to(tl.uint64, bitcast=True) ^ _FINGERPRINT_SALT)
    return mix64_u64(word.to(tl.uint64, bitcast=True) ^ key).to(tl.int64, bitcast=True)


@triton.jit
def _xor_combine(a, b):
    return a ^ b


@triton.jit
def fingerprint_rows(
    words_ptr,
    row_offsets,
    row_mask,
    NUM_WORDS: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
):
    """Fingerprints of a tile of rows of an int64 word buffer.

    Args:
        words_ptr: pointer to int64 words; row r's words start at ``words_ptr + row_offsets[r]``
            and are contiguous.
        row_offsets: int64 ``[TILE]`` element offsets of the rows.
        row_mask: bool ``[TILE]``; masked-off rows are not read: they fold ``NUM_WORDS`` zero
            words (as the torch reference does for a slot outside the word buffer).
        NUM_WORDS: words folded per row (0 gives 0).
        WORD_CHUNK: power of two; words read per row per loop iteration.
    Returns:
        int64 ``[TILE]``, bit-identical to ``fingerprint_torch(words[row, :NUM_WORDS])``.
    """
    acc = tl.full(row_offsets.shape, 0, dtype=tl.int64)
    for chunk_start in range(0, NUM_WORDS, WORD_CHUNK):
        column = chunk_start + tl.arange(0, WORD_CHUNK)
        in_row = (column < NUM_WORDS)[None, :]
        words = tl.load(
            words_ptr + row_offsets[:, None] + column[None, :],
            mask=row_mask[:, None] & in_row,
            other=0,
        )
        terms = tl.where(in_row, fingerprint_term(words, column[None, :]), 0)
        acc ^= tl.reduce(terms, 1, _xor_combine)
    return acc
