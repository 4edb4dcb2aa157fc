"""The radix sweep: every slot the radix cache holds is verified, not only the slots live
requests read.

Corruption of a cached prefix that no running request uses is invisible to the per-forward
checks until some later request matches it. With ``SGLANG_KV_CANARY_SWEEP_INTERVAL=N`` a sweep
*pass* starts every N forward steps and walks the radix tree; after each forward (outside
graphs, on the forward's stream, never synchronizing) it verifies at most
:data:`SLOTS_PER_STEP` slots, so no step stalls on a large cache, until the pass has covered the
whole tree. Each slot is checked against what the tree says it holds: its position (the node's
depth plus the offset), its token (the node's key), its chain value (from the record of the
previous slot of the same path, or the anchor at position 0) and, with real data, its
fingerprint. Violations are reported with ``check=sweep``. Which caches can be walked, and the
record slots of a node's KV indices, are the pool seam's
(:meth:`~..pools.seam.CanaryPool.sweep_refusal`, :meth:`~..pools.seam.CanaryPool.cached_record_slots`).

The walk keeps a stack of tree nodes between steps. The scheduler changes the tree only between
forwards, so each step sees a consistent tree: a node evicted since it was stacked (no longer
its parent's child) is skipped, its slots may belong to someone else now; a node split since
then is still a valid path (its depth is recomputed from its parent chain when it is visited,
and the new parent node is covered by a later pass). With EAGLE, whose keys are bigrams, the
sweep belongs to the target model's canary: the tree's slots are the target pool's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState, SweepEntries
from sglang.srt.kv_canary.pools.seam import CanaryPool

SLOTS_PER_STEP = 1 << 15  # slots verified per forward step at most
_NO_PREVIOUS = -1  # prev slot of position 0: the chain must be the anchor


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepStep:
    """What one sweep step verified."""

    slots: int
    nodes: int
    pass_done: bool


class RadixSweep:
    """Incremental passes over one radix cache (see the module docstring).

    Args:
        tree_cache: a prefix cache the pool seam can walk (SGLang's ``RadixCache``).
        state: the canary's device state (records, ring, counters).
        pool: the pool seam (the record slots of a node's KV indices).
        launch: the sweep launch (``launch_sweep(*, state, entries)``).
        interval: a pass starts every ``interval`` forward steps (when none is running).
        slots_per_step: bound of the slots verified per forward step.
    """

    def __init__(
        self,
        *,
        tree_cache: Any,
        state: CanaryDeviceState,
        pool: CanaryPool,
        launch: Callable[..., None],
        interval: int,
        slots_per_step: int = SLOTS_PER_STEP,
    ) -> None:
        if interval < 1 or slots_per_step < 1:
            raise ValueError(f"interval and slots_per_step must be >= 1, got {interval}, "
                             f"{slots_per_step}")
        self._tree = tree_cache
        self._state = state
        self._pool = pool
        self._launch = launch
        self._interval = interval
        self._slots_per_step = slots_per_step
        self._stack: list[Any] | None = None
        self._device = state.device
        self._no_previous = torch.full((1,), _NO_PREVIOUS, dtype=torch.int64, device=self._device)
        self.passes_started = 0
        self.passes_done = 0
        self.launches = 0

    @property
    def tree_cache(self) -> Any:
        return self._tree

    @property
    def pass_running(self) -> bool:
        return self._stack is not None

    def pass_starts_at(self, step: int) -> bool:
        """Whether :meth:`after_forward` at ``step`` starts a new pass."""
        return self._stack is None and step % self._interval == 0

    def after_forward(self, *, step: int) -> SweepStep | None:
        """Verify the next bounded chunk of the current pass (starting one every ``interval``
        steps). One kernel launch, none when no pass runs. No host sync.

        Args:
            step: forward steps with request rows completed so far.
        """
        if self.pass_starts_at(step):
            self._stack = list(self._tree.root_node.children.values())
            self.passes_started += 1
        if self._stack is None:
            return None
        nodes, pieces = self._next_chunk()
        done = not self._stack
        if done:
            self._stack = None
            self.passes_done += 1
        if pieces:
            self._launch(state=self._state, entries=_entries(pieces, device=self._device))
            self.launches += 1
        return SweepStep(slots=sum(len(p.tokens) for p in pieces), nodes=nodes, pass_done=done)

    def _next_chunk(self) -> tuple[int, list[_NodePiece]]:
        pieces: list[_NodePiece] = []
        budget = self._slots_per_step
        nodes = 0
        root = self._tree.root_node
        page_size = self._tree.page_size
        while self._stack and budget > 0:
            node = self._stack[-1]
            count = 0 if node.value is None else len(node.value)
            if pieces and count > budget:
                break  # the next step takes it whole
            self._stack.pop()
            self._stack.extend(node.children.values())
            depth = _depth_if_attached(node, root=root, page_size=page_size)
            if depth is None or count == 0:  # evicted or detached since it was stacked
                continue
            nodes += 1
            budget -= count
            parent = node.parent
            previous = (
                self._no_previous
                if parent is root
                else self._pool.cached_record_slots(parent.value[-1:])
            )
            pieces.append(_NodePiece(
                slots=self._pool.cached_record_slots(node.value),
                previous=previous,
                first_position=depth,
                # (an EAGLE tree keys bigrams: its raw tokens end with the next node's first)
                tokens=list(node.key.token_ids[:count]),
            ))
        return nodes, pieces


@dataclass(frozen=True, slots=True, kw_only=True)
class _NodePiece:
    slots: torch.Tensor  # int64 [k], device
    previous: torch.Tensor  # int64 [1], device: the slot before slots[0] (-1 at position 0)
    first_position: int
    tokens: list[int]


def _depth_if_attached(node: Any, *, root: Any, page_size: int) -> int | None:
    """Tokens on the path from the root to ``node`` (exclusive), or None when ``node`` is no
    longer in the tree (evicted leaves keep their parent pointer but leave its children)."""
    depth = 0
    while node is not root:
        parent = node.parent
        if parent is None or node.value is None:
            return None
        if parent.children.get(node.key.child_key(page_size)) is not node:
            return None
        if parent is not root:
            depth += len(parent.key)
        node = parent
    return depth


def _entries(pieces: list[_NodePiece], *, device: torch.device) -> SweepEntries:
    """The sweep entries of ``pieces``: device slot tensors concatenated, host positions and
    tokens packed into one (pinned) buffer and copied without blocking."""
    slots = torch.cat([piece.slots for piece in pieces])
    previous = torch.cat([
        part for piece in pieces for part in (piece.previous, piece.slots[:-1])
    ])
    total = slots.shape[0]
    host = torch.empty((2, total), dtype=torch.int64, pin_memory=device.type == "cuda")
    array = host.numpy()
    offset = 0
    for piece in pieces:
        count = len(piece.tokens)
        array[0, offset : offset + count] = range(piece.first_position,
                                                  piece.first_position + count)
        array[1, offset : offset + count] = piece.tokens
        offset += count
    packed = host.to(device, non_blocking=device.type == "cuda")
    return SweepEntries(slots=slots, prev_slots=previous, positions=packed[0],
                        tokens=packed[1])
