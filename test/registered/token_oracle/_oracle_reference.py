"""An independent, plain-Python-int reference of the token oracle for the tests.

Written from the oracle's definition, not from the package: BLAKE2b-8 of the rid read as a
little-endian signed int64; generalized id = bootstrap room if >= 0 else that hash; SplitMix64
finalizer on the unsigned 64-bit pattern of ``id XOR position``, modulo the vocabulary size. The
sampled token after position ``p`` is the oracle at ``p + 1``.
"""

from __future__ import annotations

import hashlib

MASK64 = (1 << 64) - 1


def rid_hash(rid: str) -> int:
    digest = hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest()
    value = 0
    for index, byte in enumerate(digest):  # little-endian, by hand
        value |= byte << (8 * index)
    return value - (1 << 64) if value >= (1 << 63) else value


def generalized_id(rid: str, bootstrap_room: int | None = None) -> int:
    if bootstrap_room is not None and bootstrap_room >= 0:
        return bootstrap_room
    return rid_hash(rid)


def splitmix64_finalizer(value: int) -> int:
    x = value & MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def oracle_token(gen_id: int, position: int, vocab_size: int) -> int:
    return splitmix64_finalizer((gen_id & MASK64) ^ (position & MASK64)) % vocab_size


def expected_output_ids(*, rid: str, prompt_len: int, num_tokens: int, vocab_size: int,
                        bootstrap_room: int | None = None) -> list[int]:
    """The tokens a request generates: output ``k`` sits at position ``prompt_len + k``."""
    gen_id = generalized_id(rid, bootstrap_room)
    return [oracle_token(gen_id, prompt_len + k, vocab_size) for k in range(num_tokens)]
