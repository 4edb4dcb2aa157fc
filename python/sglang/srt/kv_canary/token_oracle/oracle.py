"""Token oracles: the token a request "generates" at a position, from its id and the position.

:class:`HashOracle` is SPEC §4's oracle: ``token = mix64(gen_req_id XOR position) mod vocab_size``
with unsigned 64-bit semantics (SplitMix64 finalizer, logical shifts, wrap-around multiplies,
unsigned modulo) computed on int64 tensors, or on the host with numpy
(:meth:`HashOracle.host_tokens`). :func:`hash_oracle_token_scalar` is its pure-Python reference;
the three agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from sglang.jit_kernel.kv_canary.hashing import (
    U64_MASK,
    mix64_numpy,
    mix64_scalar,
    mix64_torch,
    require_int64_same_shape,
    unsigned_mod_torch,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import MAX_ORACLE_VOCAB_SIZE

MAX_VOCAB_SIZE = MAX_ORACLE_VOCAB_SIZE  # tokens are returned as int32


class TokenOracle(Protocol):
    """Maps (generalized request id, position) to the token at that position."""

    @property
    def vocab_size(self) -> int: ...

    def expected_tokens(
        self, *, generalized_req_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """int32 tokens in ``[0, vocab_size)``, elementwise over two int64 tensors of one shape."""
        ...

    def host_tokens(self, *, generalized_req_id: int, positions: np.ndarray) -> np.ndarray:
        """:meth:`expected_tokens` of one request on the host: int64 ``[n]`` tokens at int64
        ``positions [n]``."""
        ...

    def write_tokens(
        self,
        *,
        req_ids: torch.Tensor,
        bootstrap_room_ids: torch.Tensor | None,
        positions: torch.Tensor,
        position_offset: int,
        tokens_out: torch.Tensor,
        positions_out: torch.Tensor | None = None,
    ) -> None:
        """The tokens of 1-D rows at ``positions + position_offset`` into ``tokens_out`` (and
        those positions into ``positions_out``); per row the generalized id is its bootstrap
        room where that is >= 0, else its ``req_ids`` entry. No host sync; CUDA-graph
        capturable."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class HashOracle:
    """``token = mix64(u64(gen_req_id) ^ u64(position)) mod vocab_size``.

    Attributes:
        vocab_size: the served model's vocabulary size, in ``[1, 2**31 - 1]``.
    """

    vocab_size: int

    def __post_init__(self) -> None:
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int) or not (
            1 <= self.vocab_size <= MAX_VOCAB_SIZE
        ):
            raise ValueError(
                f"vocab_size={self.vocab_size!r} is invalid; allowed: an integer in "
                f"[1, {MAX_VOCAB_SIZE}]"
            )

    def expected_tokens(
        self, *, generalized_req_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The oracle's tokens.

        Args:
            generalized_req_ids: int64, any shape and device.
            positions: int64, the same shape and device.
        Returns:
            int32 of that shape, each in ``[0, vocab_size)``. Elementwise torch ops only: no host
            sync, fixed shapes, CUDA-graph capturable.
        Raises:
            TypeError / ValueError: a dtype is not int64, or the shapes differ.
        """
        require_int64_same_shape(("generalized_req_ids", generalized_req_ids),
                                 ("positions", positions))
        mixed = mix64_torch(generalized_req_ids ^ positions)
        return unsigned_mod_torch(mixed, self.vocab_size).to(torch.int32)

    def host_tokens(self, *, generalized_req_id: int, positions: np.ndarray) -> np.ndarray:
        """The oracle's tokens of one request on the host (numpy, vectorized): int64 ``[n]``, at
        int64 ``positions [n]``; ``generalized_req_id`` is a signed int64 value."""
        mixed = positions.astype(np.uint64) ^ np.uint64(generalized_req_id & U64_MASK)
        return (mix64_numpy(mixed) % np.uint64(self.vocab_size)).astype(np.int64)

    def write_tokens(
        self,
        *,
        req_ids: torch.Tensor,
        bootstrap_room_ids: torch.Tensor | None,
        positions: torch.Tensor,
        position_offset: int,
        tokens_out: torch.Tensor,
        positions_out: torch.Tensor | None = None,
    ) -> None:
        """The oracle's tokens of 1-D rows, in one launch on CUDA (the Triton kernel of
        :mod:`sglang.jit_kernel.kv_canary.hash_oracle`; its contract applies: ``req_ids`` /
        ``bootstrap_room_ids`` int64, ``positions`` int32 or int64, ``tokens_out`` int32 or
        int64, ``positions_out`` int64, all ``[n]``), its torch twin elsewhere. Identical to
        :meth:`expected_tokens` at ``positions + position_offset``; no host sync, CUDA-graph
        capturable (the Triton launch allocates nothing).

        Raises:
            TypeError / ValueError: the contract is not met (see
                :func:`~sglang.jit_kernel.kv_canary.kernel_inputs.check_hash_oracle_inputs`).
        """
        _hash_oracle_launch(tokens_out.device)(
            req_ids=req_ids,
            bootstrap_room_ids=bootstrap_room_ids,
            positions=positions,
            position_offset=position_offset,
            vocab_size=self.vocab_size,
            tokens_out=tokens_out,
            positions_out=positions_out,
        )


def _hash_oracle_launch(device: torch.device) -> Callable[..., None]:
    """The Triton launch on CUDA, the torch twin elsewhere (imported on first use)."""
    if device.type == "cuda":
        from sglang.jit_kernel.kv_canary.hash_oracle import launch_hash_oracle_tokens

        return launch_hash_oracle_tokens
    from sglang.jit_kernel.kv_canary.hash_oracle_ref import hash_oracle_tokens_torch_reference

    return hash_oracle_tokens_torch_reference


def hash_oracle_token_scalar(*, generalized_req_id: int, position: int, vocab_size: int) -> int:
    """Pure-Python reference of :meth:`HashOracle.expected_tokens` for one element."""
    return mix64_scalar(generalized_req_id ^ position) % vocab_size
