"""Persistent scheduler and engine bugs for the self-check's simulated server.

Each class below is a :class:`~.simulation.ServerBug`: the :class:`~.simulation.SimulatedServer`
consults it at its defined points (admission and prefix match, decode planning, before a decode
step, the model's K/V store). Unlike the runtime perturbations, which corrupt one forward and undo
it, these are real bugs: what they map or write stays. Each is seeded, starts after
``warmup_steps`` forwards, injects at most ``max_faults`` faults (each on a request no earlier
fault touched) and reports every fault with one ``kv_canary perturb:`` line (see
:meth:`~.simulation.SimulatedServer.report_fault`): its ``step``, ``row``, ``rid`` and
``position`` say where the canary must report it, ``req_pool_idx`` the request row(s) the
report is attributed to.

Fault lines name the bug (each is caught by the reason in brackets):

- ``stale_slot_reuse`` [verify_owner]: a running request's pages are freed as if it had
  finished and handed to the next new request, which writes its own prompt at the same
  positions; the old request keeps reading them through its stale ``req_to_token`` row.
- ``foreign_cached_prefix`` [verify_owner]: the prefix cache hands a new request the cached
  pages of a different prompt, as many as a real match could give.
- ``prefix_rounded_up`` [verify_owner]: a prefix match rounded up by a page (one more page than
  actually matches).
- ``sibling_mixed_pointer`` [verify_owner]: parallel sampling; sibling A's ``req_to_token[P-1]``
  points at sibling B's slot of ``P-1`` (the first output position, where B stored a different
  token).
- ``sibling_shared_slot`` [verify_owner]: parallel sampling; two siblings are allocated one slot
  for their first decoded tokens.
- ``seq_lens_drift`` [verify_owner]: a request's seq_len drifts by -1, consistently on host and
  device: its new token gets position ``P-1`` and a new slot replaces ``req_to_token[P-1]``.
- ``prefix_slot_zero`` [verify_unmapped]: a prefix entry of a running request's row becomes 0.
- ``write_slot_zero`` [write_unmapped]: a decoded token is allocated slot 0.
- ``last_forward_overwrite`` [verify_overwritten]: in a request's last forward another row of the
  step is allocated one of its prefix slots (the model writes the other token's K/V over it).
- ``kv_bit_flip_v`` / ``kv_bit_flip_k`` [verify_real_kv_hash, real data on]: a bit of a live
  prefix slot's V (K) of the last layer flips in the model's K/V store, inside the slot's
  rotating 16-byte window of ``real_data=partial``.

Host-tier bugs (a server with a host tier), consulted when a host-only prefix is loaded back at
a request's admission; the request's first forward is the load-back forward:

- ``load_shifted_page`` [verify_position]: the load copies each page into the next page's
  device slots (K/V and the indices the canary is given alike); the prefix stays mapped to the
  pages allocated for it.
- ``host_copy_flip`` [verify_real_kv_hash, real data on]: one byte in every 16-byte window of
  the first layer's K row of one host slot the request reads is flipped before the load.
- ``stale_host_load`` [verify_owner]: the host slots of another backed-up prefix (another
  prompt) are loaded instead of the prefix's own.

Each host-tier fault confines itself to its victim: the victim is not cached when it finishes
and the loaded prefix is dropped from the cache once the victim has its pages.

The consistent-but-foreign histories (the first six) leave every record's position and chain
consistent with the records before it: only the ownership check (the chain the request's own
history implies) can tell them from a correct history, so they are caught with the token checks
off and real data off. Where the canary reports them: the pre launch's ownership row sits at the
forward's ``P - 1``, the post launch's at ``P + n - 1``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import torch

from sglang.jit_kernel.kv_canary.hashing import due_source_scalar, fingerprint_columns
from sglang.srt.kv_canary.pools.mha import MHACanaryPool
from sglang.srt.kv_canary.selfcheck.simulation import (
    DecodeSlot,
    HostLoad,
    PrefixMatch,
    ServerBug,
    SimulatedRequest,
    SimulatedServer,
)

DEFAULT_MAX_FAULTS = 3
_WORD_BYTES = 8
_WINDOW_BYTES = 16  # the bytes ``real_data=partial`` folds of a row, at a rotating window


class SeededBug(ServerBug):
    """A bug with a seeded generator, a warm-up and a fault budget (see the module docstring).

    Args:
        warmup_steps: forwards before the bug starts acting.
        seed: seed of the generator that picks its targets.
        max_faults: the most faults it injects.
    """

    def __init__(
        self, *, warmup_steps: int, seed: int, max_faults: int = DEFAULT_MAX_FAULTS
    ) -> None:
        self.warmup_steps = warmup_steps
        self.rng = random.Random(seed)
        self.max_faults = max_faults
        self.faults = 0
        self._touched: set[int] = set()  # id() of every request a fault involved

    def active(self, *, server: SimulatedServer) -> bool:
        """Whether the bug may act now (warm-up over, budget left)."""
        return server.forwards >= self.warmup_steps and self.faults < self.max_faults

    def untouched(self, *, requests: Sequence[SimulatedRequest]) -> list[SimulatedRequest]:
        """The requests no earlier fault involved."""
        return [request for request in requests if id(request) not in self._touched]

    def report(
        self,
        *,
        server: SimulatedServer,
        victim: SimulatedRequest,
        position: int,
        involved: Sequence[SimulatedRequest] = (),
        req_pool_indices: Sequence[int] = (),
        detail: str = "",
    ) -> None:
        """Count and log one fault (``involved``: other requests it touched)."""
        self.faults += 1
        for request in (victim, *involved):
            self._touched.add(id(request))
        server.report_fault(
            fault=self.name, victim=victim, position=position,
            req_pool_indices=req_pool_indices, detail=detail,
        )


def _row_slot(*, server: SimulatedServer, request: SimulatedRequest, position: int) -> int:
    """``req_to_token[request.req_pool_idx, position]``."""
    return int(server.req_to_token_pool.req_to_token[request.req_pool_idx, position])


def _decoding_pairs(*, rows: Sequence[DecodeSlot]) -> list[tuple[DecodeSlot, DecodeSlot]]:
    """Ordered pairs of distinct rows whose requests are siblings (one parallel-sampling group)."""
    return [
        (a, b) for a in rows for b in rows
        if a is not b and a.request.group is not None and a.request.group == b.request.group
    ]


# ============================================================================ foreign histories


class StaleSlotReuse(SeededBug):
    """Admission of a new request with no cached prefix: a running request ``Z`` whose pages are
    its own (no other reference) and whose ``kv_len`` is at most the new prompt's length has
    its pages handed to the new request at the same page indices (a premature free followed by
    a reallocation). The new request's prefill writes its own history over ``Z``'s positions
    ``[0, kv_len)``; ``Z``'s row still points there. ``Z``'s next token goes to a fresh page
    when its last page is partial (the scheduler allocates its future tokens anew), so the
    two requests never write one slot. Reported on ``Z`` at ``kv_len - 1``: its next forward's
    ownership check (the workload prefills new requests in their own EXTEND forward, so that
    forward comes after the new request wrote the slots)."""

    name = "stale_slot_reuse"

    def after_admit(self, *, server: SimulatedServer, request: SimulatedRequest) -> None:
        if not self.active(server=server) or request.pages:
            return
        page = server.page_size
        candidates = [
            z for z in self.untouched(requests=server.live_requests)
            if z is not request and z.prefilled and not z.finished
            and 1 <= z.kv_len <= len(request.prompt)
            and all(server.page_refs(page=p) == 1 for p in z.pages[: -(-z.kv_len // page)])
        ]
        if not candidates:
            return
        victim = self.rng.choice(candidates)
        taken = victim.pages[: -(-victim.kv_len // page)]
        for p in taken:
            server.reference_page(page=p)
        request.pages = list(taken)
        if victim.kv_len % page:
            last = len(taken) - 1
            victim.extra_pages.append(victim.pages[last])
            victim.pages[last] = server.alloc_page()
        victim.cacheable = False
        self.report(
            server=server, victim=victim, position=victim.kv_len - 1, involved=[request],
            detail=f"new_rid={request.rid} pages={len(taken)}",
        )


class ForeignCachedPrefix(SeededBug):
    """Admission: the prefix cache returns the pages of a cached prompt that differs from the
    request's within the shared length, as many as the request may share (the most any entry
    gives). Reported on the request at ``P - 1`` (``P`` the shared length): its prefill's
    ownership check."""

    name = "foreign_cached_prefix"

    def match_prefix(
        self, *, server: SimulatedServer, request: SimulatedRequest, match: PrefixMatch
    ) -> PrefixMatch:
        if not self.active(server=server):
            return match
        page, limit = server.page_size, server.prefix_limit(prompt=request.prompt)
        candidates = []
        for key, pages in server.prefix_cache():
            usable = min(len(pages), limit)
            if usable >= 1 and list(key[: usable * page]) != request.prompt[: usable * page]:
                candidates.append((usable, key, pages))
        if not candidates:
            return match
        most = max(usable for usable, _, _ in candidates)
        usable, key, pages = self.rng.choice([c for c in candidates if c[0] == most])
        request.cacheable = False
        self.report(
            server=server, victim=request, position=usable * page - 1,
            detail=f"shared_pages={usable} correct_pages={len(match.pages)}",
        )
        return PrefixMatch(pages=pages[:usable], key=key, common=0)


class PrefixRoundedUp(SeededBug):
    """Admission: a prefix match of ``k`` pages whose entry matches part of page ``k`` too (at
    least one prompt token matched, not capped by the entry or the prompt) is rounded up to
    ``k + 1`` pages. Reported on the request at ``(k + 1) * page_size - 1``: its prefill's
    ownership check."""

    name = "prefix_rounded_up"

    def match_prefix(
        self, *, server: SimulatedServer, request: SimulatedRequest, match: PrefixMatch
    ) -> PrefixMatch:
        if not self.active(server=server) or match.key is None:
            return match
        page, k = server.page_size, len(match.pages)
        entry_pages = dict(server.prefix_cache())[match.key]
        if (
            match.common < 1 or match.common // page != k
            or k + 1 > server.prefix_limit(prompt=request.prompt) or k + 1 > len(entry_pages)
        ):
            return match
        request.cacheable = False
        self.report(
            server=server, victim=request, position=(k + 1) * page - 1,
            detail=f"matched_tokens={match.common} shared_pages={k + 1}",
        )
        return PrefixMatch(pages=entry_pages[: k + 1], key=match.key, common=match.common)


class SiblingMixedPointer(SeededBug):
    """Before a decode step: siblings ``A`` and ``B`` that both decoded their first output
    token (``A``'s prefix is its prompt + 1, the tokens at the prompt's length differ): ``A``'s
    ``req_to_token[P - 1]`` is pointed at ``B``'s slot. Reported on ``A`` at ``P - 1``: the
    same forward's ownership check."""

    name = "sibling_mixed_pointer"

    def before_decode(
        self, *, server: SimulatedServer, requests: Sequence[SimulatedRequest]
    ) -> None:
        if not self.active(server=server):
            return
        untouched = self.untouched(requests=requests)
        pairs = [
            (a, b) for a in untouched for b in untouched
            if a is not b and a.group is not None and a.group == b.group
            and a.kv_len == len(a.prompt) + 1 and b.kv_len >= a.kv_len
            and a.tokens[a.kv_len - 1] != b.tokens[a.kv_len - 1]
        ]
        if not pairs:
            return
        a, b = self.rng.choice(pairs)
        position = a.kv_len - 1
        slot = _row_slot(server=server, request=b, position=position)
        server.share_page(request=a, page=server.page_of(slot=slot))
        server.req_to_token_pool.write((a.req_pool_idx, position), slot)
        a.cacheable = False
        self.report(
            server=server, victim=a, position=position, involved=[b],
            detail=f"partner_rid={b.rid} slot={slot}",
        )


class SiblingSharedSlot(SeededBug):
    """Decode planning: siblings ``A`` and ``B`` decoding their first output tokens (different
    ones) are allocated one slot, ``B``'s. Both write it in the pre launch; whichever record
    survives (launch order), the other sibling's post-launch ownership check at ``P`` fails, so
    the fault is reported at ``P`` attributed to either row."""

    name = "sibling_shared_slot"

    def plan_decode(self, *, server: SimulatedServer, rows: list[DecodeSlot]) -> None:
        if not self.active(server=server):
            return
        untouched = set(map(id, self.untouched(requests=[row.request for row in rows])))
        pairs = [
            (a, b) for a, b in _decoding_pairs(rows=rows)
            if id(a.request) in untouched and id(b.request) in untouched
            and a.position == len(a.request.prompt) == b.position
            and a.request.tokens[-1] != b.request.tokens[-1]
        ]
        if not pairs:
            return
        a, b = self.rng.choice(pairs)
        server.share_page(request=a.request, page=server.page_of(slot=b.slot))
        a.slot = b.slot
        a.request.cacheable = b.request.cacheable = False
        self.report(
            server=server, victim=a.request, position=a.position, involved=[b.request],
            req_pool_indices=[a.request.req_pool_idx, b.request.req_pool_idx],
            detail=f"partner_rid={b.request.rid} slot={b.slot}",
        )


class SeqLensDrift(SeededBug):
    """Decode planning: one request (prefix ``K >= 2``) runs with seq_len ``K`` instead of
    ``K + 1`` on host and device alike: its new token gets position ``K - 1``, a freshly
    allocated slot replaces ``req_to_token[K - 1]``, and its ``kv_len`` stays ``K`` (the drift
    persists). Reported at ``K - 2``, the drifted prefix's ``P - 1``: the same forward's
    ownership check."""

    name = "seq_lens_drift"

    def plan_decode(self, *, server: SimulatedServer, rows: list[DecodeSlot]) -> None:
        if not self.active(server=server):
            return
        untouched = set(map(id, self.untouched(requests=[row.request for row in rows])))
        candidates = [row for row in rows if id(row.request) in untouched and row.position >= 2]
        if not candidates:
            return
        row = self.rng.choice(candidates)
        page = server.alloc_page()
        row.request.extra_pages.append(page)
        row.position -= 1
        row.slot = page
        row.request.cacheable = False
        self.report(
            server=server, victim=row.request, position=row.position - 1,
            detail=f"seq_len={row.position + 1} expected_seq_len={row.position + 2} slot={page}",
        )


# ============================================================================ slot 0


class PrefixSlotZero(SeededBug):
    """Before a decode step: ``req_to_token`` of one request's prefix position ``q <= P - 2``
    becomes 0 (the padding slot). Reported at ``q``: the same forward's pre-launch
    ``verify_unmapped``."""

    name = "prefix_slot_zero"

    def before_decode(
        self, *, server: SimulatedServer, requests: Sequence[SimulatedRequest]
    ) -> None:
        if not self.active(server=server):
            return
        candidates = [r for r in self.untouched(requests=requests) if r.kv_len >= 2]
        if not candidates:
            return
        request = self.rng.choice(candidates)
        position = self.rng.randrange(request.kv_len - 1)
        server.req_to_token_pool.write((request.req_pool_idx, position), 0)
        self.report(server=server, victim=request, position=position)


class WriteSlotZero(SeededBug):
    """Decode planning: one request's new token is allocated slot 0 (``out_cache_loc`` and
    ``req_to_token``). Reported at its position: the same forward's ``write_unmapped``."""

    name = "write_slot_zero"

    def plan_decode(self, *, server: SimulatedServer, rows: list[DecodeSlot]) -> None:
        if not self.active(server=server):
            return
        untouched = set(map(id, self.untouched(requests=[row.request for row in rows])))
        candidates = [row for row in rows if id(row.request) in untouched]
        if not candidates:
            return
        row = self.rng.choice(candidates)
        row.slot = 0
        row.request.cacheable = False
        self.report(server=server, victim=row.request, position=row.position)


# ============================================================================ overwritten prefix


class LastForwardOverwrite(SeededBug):
    """Decode planning: a victim decoding its last token (it finishes after this step) and a
    culprit, another row of the step: the culprit's new token is allocated the victim's slot of
    a prefix position ``q`` on a page only the victim references, so the model writes the
    culprit's K/V over it. No later forward of the victim exists: it is reported at ``q``,
    attributed to the victim's row, for the same forward's post-launch ``verify_overwritten``.
    The culprit keeps that page referenced while it runs."""

    name = "last_forward_overwrite"

    def plan_decode(self, *, server: SimulatedServer, rows: list[DecodeSlot]) -> None:
        if not self.active(server=server) or len(rows) < 2:
            return
        untouched = set(map(id, self.untouched(requests=[row.request for row in rows])))
        targets = []
        for row in rows:
            victim = row.request
            if id(victim) not in untouched or len(victim.output) + 1 < victim.max_new_tokens:
                continue
            for position in range(row.position):
                slot = _row_slot(server=server, request=victim, position=position)
                if slot and server.page_refs(page=server.page_of(slot=slot)) == 1:
                    targets.append((row, position, slot))
        if not targets:
            return
        row, position, slot = self.rng.choice(targets)
        culprit = self.rng.choice([other for other in rows if other is not row])
        server.share_page(request=culprit.request, page=server.page_of(slot=slot))
        culprit.slot = slot
        row.request.cacheable = culprit.request.cacheable = False
        self.report(
            server=server, victim=row.request, position=position, involved=[culprit.request],
            detail=f"culprit_rid={culprit.request.rid} culprit_position={culprit.position} "
            f"slot={slot}",
        )


# ============================================================================ K/V bytes


class KvBitFlip(SeededBug):
    """In the model's K/V store, after it wrote this forward's K/V: one bit of a live prefix
    slot's row in the last layer's V (:class:`KvBitFlipK`: K) buffer flips, in a byte inside
    the slot's rotating 16-byte window that ``real_data=partial`` fingerprints, at a position
    whose ``partial`` verify in this forward reads that row (so ``partial`` covers it as well as
    ``all``). Each fault flips a different slot. Reported at the slot's
    position in a row of this forward: the same forward's post-launch ``verify_real_kv_hash``
    (silent with real data off)."""

    name = "kv_bit_flip_v"
    buffer = "v"

    def __init__(
        self, *, warmup_steps: int, seed: int, max_faults: int = DEFAULT_MAX_FAULTS
    ) -> None:
        super().__init__(warmup_steps=warmup_steps, seed=seed, max_faults=max_faults)
        self._flipped: set[int] = set()

    def after_kv_store(self, *, server: SimulatedServer) -> None:
        if not self.active(server=server) or not server.batch:
            return
        pool = server.kv_pool
        layers = MHACanaryPool(pool).fingerprinted_layers()
        layer = layers[-1]
        # the source index of the flipped row (K, V per fingerprinted layer, in order): only
        # positions whose partial verify in this forward reads that row (stride 1)
        source = 2 * (len(layers) - 1) + (1 if self.buffer == "v" else 0)
        targets = [
            (request, position, slot)
            for request in self.untouched(requests=server.batch)
            for position in range(request.kv_len)
            if due_source_scalar(position=position, step=server.forwards, stride=1,
                                 num_sources=2 * len(layers)) == source
            and (slot := _row_slot(server=server, request=request, position=position))
            and slot not in self._flipped
        ]
        if not targets:
            return
        request, position, slot = self.rng.choice(targets)
        buffer = (pool.v_buffer if self.buffer == "v" else pool.k_buffer)[layer]
        row_bytes = buffer.view(buffer.shape[0], -1).view(torch.uint8)
        byte = self.flip_byte(slot=slot, row_bytes=row_bytes.shape[1], num_rows=row_bytes.shape[0])
        bit = self.rng.randrange(8)
        row_bytes[slot, byte] ^= 1 << bit
        self._flipped.add(slot)
        self.report(
            server=server, victim=request, position=position,
            detail=f"buffer=layer_{layer}_{self.buffer.upper()} slot={slot} byte={byte} bit={bit}",
        )


    def flip_byte(self, *, slot: int, row_bytes: int, num_rows: int) -> int:
        """The byte of ``slot``'s row (``row_bytes`` long, of a buffer of ``num_rows`` rows) to
        flip: a seeded pick inside the 16-byte window ``real_data=partial`` folds for it."""
        columns = fingerprint_columns(
            slot=slot, words_per_row=row_bytes // _WORD_BYTES, num_rows=num_rows, partial=True
        )
        return columns.start * _WORD_BYTES + self.rng.randrange(len(columns) * _WORD_BYTES)


class KvBitFlipK(KvBitFlip):
    """:class:`KvBitFlip` in the last layer's K buffer."""

    name = "kv_bit_flip_k"
    buffer = "k"


# ============================================================================ host tier


class HostLoadBug(SeededBug):
    """A bug of host-tier loads: at the load-back of a request's admission (see
    :meth:`~.simulation.ServerBug.before_load`), :meth:`corrupt` may change the load; a changed
    load is confined to its victim (not cached at its finish; the loaded prefix dropped from
    both tiers once the victim holds its pages, so no later request reads it)."""

    def __init__(
        self, *, warmup_steps: int, seed: int, max_faults: int = DEFAULT_MAX_FAULTS
    ) -> None:
        super().__init__(warmup_steps=warmup_steps, seed=seed, max_faults=max_faults)
        self._confined: dict[int, tuple[int, ...]] = {}  # id(victim) -> the loaded prefix

    def before_load(
        self, *, server: SimulatedServer, request: SimulatedRequest, load: HostLoad
    ) -> HostLoad:
        if not self.active(server=server) or not self.untouched(requests=[request]):
            return load
        changed = self.corrupt(server=server, request=request, load=load)
        if changed is None:
            return load
        request.cacheable = False
        self._confined[id(request)] = load.key
        return changed

    def after_admit(self, *, server: SimulatedServer, request: SimulatedRequest) -> None:
        key = self._confined.pop(id(request), None)
        if key is not None:
            server.forget_prefix(key=key)

    def corrupt(
        self, *, server: SimulatedServer, request: SimulatedRequest, load: HostLoad
    ) -> HostLoad | None:
        """The load as the bug runs it, reported (None: the bug passes this one)."""
        raise NotImplementedError


class LoadShiftedByAPage(HostLoadBug):
    """A load of two pages or more copies page ``i`` into the device slots of page ``i + 1``
    (the last page into the first's): ``device_slots`` rotated by a page, for the copy and for
    the indices the load hooks get, while the prefix stays mapped to the pages the server
    allocated. So the request's page ``j`` holds the K/V and the records of page ``j - 1``
    (page 0 those of the last page), self-consistent but at other positions. Reported at
    position 0: the load-back forward's pre-launch ``verify_position``."""

    name = "load_shifted_page"

    def corrupt(
        self, *, server: SimulatedServer, request: SimulatedRequest, load: HostLoad
    ) -> HostLoad | None:
        count, page = load.device_slots.shape[0], server.page_size
        if count < 2 * page:
            return None
        self.report(server=server, victim=request, position=0,
                    detail=f"loaded_tokens={count} shift={page}")
        return replace(load, device_slots=torch.roll(load.device_slots, -page))


class HostCopyByteFlip(HostLoadBug):
    """Between a prefix's backup and its load-back: in the host copy of one slot the request
    reads, the first layer's K row gets one byte flipped in each of its 16-byte windows, so
    whichever window ``real_data=partial`` folds (placed by the slot the copy came from)
    changes. The load copies the flipped bytes to the device; the re-key finds them changed and
    complements the slot's fingerprint. Reported at the slot's position: the load-back
    forward's post-launch ``verify_real_kv_hash`` (silent with real data off)."""

    name = "host_copy_flip"

    def corrupt(
        self, *, server: SimulatedServer, request: SimulatedRequest, load: HostLoad
    ) -> HostLoad | None:
        if load.shared_len < 1 or server.host_pool is None:
            return None
        position = self.rng.randrange(load.shared_len)
        host_slot = int(load.host_slots[position])
        rows = server.host_pool.k_data_refs[0]
        row = rows.view(rows.shape[0], -1).view(torch.uint8)[host_slot]
        flipped = [window * _WINDOW_BYTES + self.rng.randrange(_WINDOW_BYTES)
                   for window in range(max(1, row.shape[0] // _WINDOW_BYTES))]
        for byte in flipped:
            row[byte] ^= 1 << self.rng.randrange(8)
        self.report(server=server, victim=request, position=position,
                    detail=f"buffer=layer_0_K host_slot={host_slot} "
                    f"bytes={','.join(map(str, flipped))}")
        return load


class StaleHostLoad(HostLoadBug):
    """A load copies the host slots of another backed-up prefix instead of the prefix's own:
    one whose prompt differs within the positions the request reads and that has as many pages
    or more (its first ones are taken). The request's pages hold that prompt's K/V and records:
    positions and chain consistent (another history from position 0), the fingerprints those of
    the bytes; the request's own history is not. Reported at ``shared_len - 1``: the
    load-back forward's ownership check of the new owner (``pre_verify``)."""

    name = "stale_host_load"

    def corrupt(
        self, *, server: SimulatedServer, request: SimulatedRequest, load: HostLoad
    ) -> HostLoad | None:
        count, shared = load.host_slots.shape[0], load.shared_len
        candidates = [
            (key, copy) for key, copy in server.host_cache()
            if key != load.key and len(copy.host_pages) * server.page_size >= count
            and key[:shared] != load.key[:shared]
        ]
        if shared < 1 or not candidates:
            return None
        key, copy = self.rng.choice(candidates)
        host_slots = server.page_slots(pages=copy.host_pages)[:count]
        self.report(server=server, victim=request, position=shared - 1,
                    detail=f"loaded_tokens={count} stale_host_slot={int(host_slots[0])}")
        return replace(load, host_slots=host_slots)
