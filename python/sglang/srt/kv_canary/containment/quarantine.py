"""Healing SGLang's ``RadixCache``: the nodes that hold a suspect slot, or a faulted request's
prefix from the reported position on, are taken out of the tree so that no later match finds
them; their KV slots are freed as soon as no request holds them any more.

How (all on the scheduler thread, between two of SGLang's own tree operations):

1. **Find** the targets: a ``(node, offset)`` per suspect slot (one walk of the tree and one
   device read of its slot values: the cold path of a report with violations) and per faulted
   request's position (its locked path, ``req.last_node`` up to the root). The offset is
   rounded down to the page.
2. **Cut**: a node whose target offset is not 0 is split there with SGLang's ``_split_node``, so
   the part before the suspect position stays cached.
3. **Detach** each cut node (with its subtree) from its parent's children: matches and inserts
   walk ``children``, so from now on nothing reaches it, and a request admitted later recomputes
   that prefix and inserts fresh nodes in its place. The tree's size counters drop the detached
   tokens, and the quarantine takes one reference of its own on every detached node
   (``lock_ref += 1``): SGLang's ``dec_lock_ref`` from the requests still holding them then
   never marks one evictable, so SGLang's eviction never sees them.
4. **Release**: a detached node whose only reference left is the quarantine's has no holder
   (references propagate to ancestors, so its subtree has none either): its subtree's slots are
   freed through the token allocator and it is forgotten.

The requests that hold a detached node are exactly the ones whose locked path runs through it
(:meth:`RadixQuarantine.holds`); the controller aborts them, and an aborted request never
inserts its KV (``skip_radix_cache_insert``), so no slot of a detached node comes back into the
tree. A tree ``reset`` (flush) drops the quarantine without freeing: the allocator is cleared
with it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_HOLD = 1  # the quarantine's own reference on every detached node


@dataclass(frozen=True, slots=True, kw_only=True)
class Detached:
    """What one :meth:`RadixQuarantine.detach` took out of the tree."""

    nodes: int
    tokens: int
    locked_nodes: int  # held by requests: freed when they finish


def supports_quarantine(tree_cache: Any) -> bool:
    """SGLang's plain ``RadixCache`` (not its subclasses: SWA, hierarchical, mamba)."""
    from sglang.srt.mem_cache.radix_cache import RadixCache

    return type(tree_cache) is RadixCache


class RadixQuarantine:
    """The detached nodes of one ``RadixCache`` (see the module docstring).

    Args:
        tree_cache: the scheduler's ``RadixCache``.
    """

    def __init__(self, *, tree_cache: Any) -> None:
        self._tree = tree_cache
        self._page = max(1, int(tree_cache.page_size))
        self._tops: list[tuple[Any, Any]] = []  # (detached top node, the tree root it left)
        self._top_ids: set[int] = set()

    @property
    def pending_nodes(self) -> int:
        """Detached subtrees still held by a request."""
        return len(self._tops)

    # ------------------------------------------------------------------ finding

    def targets_for_slots(self, slots: Collection[int]) -> list[tuple[Any, int]]:
        """``(node, offset)`` of every attached node whose value holds one of ``slots``, at the
        first such offset (one device read)."""
        if not slots or self._tree.disable:
            return []
        nodes: list[Any] = []
        values: list[torch.Tensor] = []
        stack = list(self._tree.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.value is None or len(node.value) == 0:
                continue
            nodes.append(node)
            values.append(node.value)
            stack.extend(node.children.values())
        if not nodes:
            return []
        flat = torch.cat(values)
        wanted = torch.tensor(sorted(slots), dtype=flat.dtype, device=flat.device)
        hits = torch.isin(flat, wanted).nonzero().flatten().cpu().tolist()  # cold path
        ends = torch.tensor([len(v) for v in values]).cumsum(0).tolist()
        found: dict[int, tuple[Any, int]] = {}
        index = 0
        for hit in hits:  # ascending
            while ends[index] <= hit:
                index += 1
            if index not in found:
                start = ends[index] - len(values[index])
                found[index] = (nodes[index], hit - start)
        return list(found.values())

    def target_for_position(self, *, last_node: Any, position: int) -> tuple[Any, int] | None:
        """``(node, offset)`` of the node on the locked path ending at ``last_node`` that holds
        ``position``, or None when the path is shorter (the position is in the request's own,
        uncached slots) or detached already."""
        if last_node is None or position < 0:
            return None
        path = []
        node = last_node
        root = self._tree.root_node
        while node is not None and node is not root:
            if id(node) in self._top_ids:
                return None  # already out of the tree
            path.append(node)
            node = node.parent
        if node is not root:
            return None
        start = 0
        for node in reversed(path):
            length = len(node.key)
            if start <= position < start + length:
                return node, position - start
            start += length
        return None

    def everything(self) -> list[tuple[Any, int]]:
        """Every child of the root, from offset 0: the whole tree."""
        return [(node, 0) for node in self._tree.root_node.children.values()]

    # ------------------------------------------------------------------ cutting and detaching

    def cut(self, targets: Iterable[tuple[Any, int]]) -> list[Any]:
        """Split each target node at its offset rounded down to the page (the lowest offset per
        node), and return the nodes from there on: the tops to detach."""
        lowest: dict[int, tuple[Any, int]] = {}
        for node, offset in targets:
            known = lowest.get(id(node))
            if known is None or offset < known[1]:
                lowest[id(node)] = (node, offset)
        tops = []
        for node, offset in lowest.values():
            split = offset - offset % self._page
            if 0 < split < len(node.key):
                self._tree._split_node(node.key, node, split)  # node keeps the part from split
            tops.append(node)
        return tops

    def holds(self, *, last_node: Any, tops: Collection[Any]) -> bool:
        """Whether the locked path ending at ``last_node`` runs through one of ``tops`` or
        through a node detached earlier."""
        top_ids = {id(top) for top in tops} | self._top_ids
        node = last_node
        root = self._tree.root_node
        while node is not None and node is not root:
            if id(node) in top_ids:
                return True
            node = node.parent
        return False

    def detach(self, tops: Sequence[Any]) -> Detached:
        """Take ``tops`` (with their subtrees) out of the tree; a top inside another's subtree,
        or already out, counts once. Frees at once what no request holds."""
        tree = self._tree
        root = tree.root_node
        chosen = {id(top): top for top in tops}
        nodes = tokens = locked = 0
        for top in chosen.values():
            if self._inside_other(top, chosen) or not self._attached(top):
                continue
            for node in _subtree(top):
                length = len(node.key)
                if node.lock_ref > 0:
                    tree.protected_size_ -= length
                    locked += 1
                else:
                    tree.evictable_size_ -= length
                tree.evictable_leaves.discard(node)
                node.lock_ref += _HOLD
                nodes += 1
                tokens += length
                record_remove = getattr(tree, "_record_remove_event", None)
                if record_remove is not None:
                    record_remove(node)
            parent = top.parent
            parent.children.pop(top.key.child_key(self._page), None)
            tree._update_leaf_status(parent)
            self._tops.append((top, root))
            self._top_ids.add(id(top))
        self.release()
        return Detached(nodes=nodes, tokens=tokens, locked_nodes=locked)

    # ------------------------------------------------------------------ freeing

    def release(self) -> int:
        """Free every detached subtree no request holds any more; the tokens freed."""
        if not self._tops:
            return 0
        freed = 0
        kept: list[tuple[Any, Any]] = []
        for top, root in self._tops:
            if self._tree.root_node is not root:  # the tree was reset: the allocator too
                self._top_ids.discard(id(top))
                continue
            released, count = self._release_subtree(top)
            freed += count
            if released:
                self._top_ids.discard(id(top))
            else:
                kept.append((top, root))
        self._tops = kept
        return freed

    def _release_subtree(self, node: Any) -> tuple[bool, int]:
        if node.lock_ref <= _HOLD:
            values = [n.value for n in _subtree(node) if n.value is not None and len(n.value)]
            for n in _subtree(node):
                n.lock_ref = 0
            if values:
                self._tree.token_to_kv_pool_allocator.free(torch.cat(values))
            return True, sum(len(v) for v in values)
        freed = 0
        for key, child in list(node.children.items()):
            released, count = self._release_subtree(child)
            freed += count
            if released:
                del node.children[key]
        return False, freed

    # ------------------------------------------------------------------ helpers

    def _attached(self, node: Any) -> bool:
        root = self._tree.root_node
        while node is not root:
            parent = node.parent
            if parent is None or parent.children.get(node.key.child_key(self._page)) is not node:
                return False
            node = parent
        return True

    def _inside_other(self, top: Any, chosen: dict[int, Any]) -> bool:
        node = top.parent
        while node is not None:
            if id(node) in chosen or id(node) in self._top_ids:
                return True
            node = node.parent
        return False


def _subtree(top: Any) -> list[Any]:
    nodes = []
    stack = [top]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes
