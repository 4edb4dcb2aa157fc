"""The containment point of abort mode: every violation row that reached the host becomes the
abort of the requests it names and the eviction of the radix nodes that hold its slot, before the
scheduler sends the tokens of the faulted forward.

SGLang's scheduler (both event loops, 0.5.12) processes each batch's result in
``Scheduler.process_batch_result(batch, result)``, which first waits for the result's copy to the
host (``result.copy_done``; without the overlap schedule the ``.tolist()`` of the sampled tokens
waits for the stream) and then appends the tokens and streams them. The hook before it
(:meth:`Containment.before_batch_result`) makes that same wait itself, a few microseconds
earlier, so the counters published by the batch's forward (enqueued before its sampling, on the
same stream) have reached the host; it reads them (:meth:`~..monitor.monitor.CanaryMonitor.
poll_settled`), and acts on every row read so far (:class:`~.inbox.ContainmentInbox`):

* rows map to requests through the forward history (``req_pool_idx`` is reused after a request
  finishes: the history knows who held a row at a step); each named live request is aborted
  (:func:`~.requests.abort_request`), its faulted forward's token withheld;
* the slots of rows whose reasons say the slot's *content* is suspect (fingerprint, token,
  overwrite, lost write, window owner), and each aborted request's cached prefix from the
  reported position on, are cut out of the radix tree (:class:`~.quarantine.RadixQuarantine`);
  every live request whose cached prefix runs through a cut node is aborted too (it reads that
  slot);
* rows the ring dropped, or a row whose request the history does not know: every live request
  is aborted and the whole tree evicted (said in the log and the records).

Requests that are not named keep running untouched. After SGLang processed the result (the
aborted requests released their references) and when the scheduler is idle, nodes no request
holds are freed (:meth:`Containment.release`).

The bound: a row produced by forward N is acted on before any token sampled by forward N is
sent; the tokens a client received all come from forwards before N. A corruption a check sees
only later (``REAL_DATA=partial`` rotates rows; ``REAL_DATA_STRIDE``) is acted on at the forward
that sees it: the tokens of the forwards in between have left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.containment.inbox import ContainmentInbox, PendingViolations
from sglang.srt.kv_canary.containment.quarantine import RadixQuarantine
from sglang.srt.kv_canary.monitor.containment_records import (
    AbortCause,
    AbortRecord,
    ContainmentSink,
    EvictionCause,
    EvictionRecord,
)
from sglang.srt.kv_canary.containment.requests import abort_message, abort_request, live_requests
from sglang.srt.kv_canary.monitor.forward_history import ForwardHistory
from sglang.srt.kv_canary.monitor.violations import ViolationRow

logger = logging.getLogger(__name__)

CONTAINMENT_PREFIX = "kv_canary abort:"
# reasons that make the slot's content suspect for every reader (not only the row's request)
CONTENT_REASONS = (
    Reason.VERIFY_REAL_KV | Reason.VERIFY_TOKEN | Reason.WRITE_TOKEN | Reason.VERIFY_OVERWRITTEN
    | Reason.VERIFY_UNWRITTEN | Reason.VERIFY_NOT_LANDED | Reason.VERIFY_WINDOW_OWNER
)
_SLOTS_IN_RECORD = 64  # reported slots listed per eviction record


def wait_for_batch_result(result: Any) -> None:
    """The wait ``process_batch_result`` starts with: the result's copy event, or (no overlap
    schedule, CUDA) the current stream, which the sampled tokens' ``.tolist()`` waits for next."""
    copy_done = getattr(result, "copy_done", None)
    if copy_done is not None:
        copy_done.synchronize()
        return
    tokens = getattr(result, "next_token_ids", None)
    if isinstance(tokens, torch.Tensor) and tokens.device.type == "cuda":
        torch.cuda.current_stream(tokens.device).synchronize()


class Containment:
    """Abort mode of one scheduler (see the module docstring).

    Args:
        inbox: the rows the monitor read and nobody acted on yet.
        history: the runner's forward history (each row's request at its step).
        poll: reads the newest publication whole until the read is not torn
            (``CanaryMonitor.poll_settled``); returns False when it gave up.
        quarantine: the radix cache's quarantine (None: no prefix cache to heal).
        sinks: told of every abort and eviction (report file, metrics).
    """

    def __init__(
        self, *, inbox: ContainmentInbox, history: ForwardHistory, poll: Callable[[], bool],
        quarantine: RadixQuarantine | None, sinks: Sequence[ContainmentSink] = (),
    ) -> None:
        self._inbox = inbox
        self._history = history
        self._poll = poll
        self._quarantine = quarantine
        self._sinks = tuple(sinks)
        self.requests_aborted = 0
        self.nodes_evicted = 0

    def before_batch_result(self, *, scheduler: Any, batch: Any, result: Any) -> None:
        """Before ``Scheduler.process_batch_result(batch, result)``: wait for the result, read
        the counters, act on the rows (see the module docstring)."""
        wait_for_batch_result(result)
        if not self._poll():
            logger.warning(f"{CONTAINMENT_PREFIX} the counters could not be read whole; the "
                           "rows of this forward are acted on at the next poll")
        self.contain(live=live_requests(scheduler=scheduler, batch=batch))

    def contain(self, *, live: Sequence[Any]) -> tuple[list[AbortRecord], list[EvictionRecord]]:
        """Act on the rows in the inbox: abort, evict, free what is free; report what was done.

        Args:
            live: the scheduler's live requests (:func:`~.requests.live_requests`).
        """
        pending = self._inbox.take()
        if pending is None:
            self.release()
            return [], []
        aborts, evictions = self._act(pending=pending, live=live)
        self.release()
        self.requests_aborted += len(aborts)
        self.nodes_evicted += sum(record.nodes for record in evictions)
        for record in aborts:
            logger.warning(
                f"{CONTAINMENT_PREFIX} rid={record.rid} cause={record.cause.value} "
                f"step={record.step} reasons={'+'.join(record.reasons) or '-'} "
                f"slot={record.slot} position={record.position} "
                f"tokens_delivered={record.tokens_delivered}"
            )
        for record in evictions:
            logger.warning(
                f"{CONTAINMENT_PREFIX} radix cache: {record.nodes} node(s), {record.tokens} "
                f"token(s) evicted ({record.locked_nodes} freed once their requests finish), "
                f"cause={record.cause.value}"
            )
        if aborts or evictions:
            for sink in self._sinks:
                sink.record_containment(aborts=aborts, evictions=evictions)
        return aborts, evictions

    def release(self) -> None:
        """Free the evicted nodes no request holds any more."""
        if self._quarantine is not None:
            self._quarantine.release()

    # ------------------------------------------------------------------ deciding

    def _act(self, *, pending: PendingViolations, live: Sequence[Any]
             ) -> tuple[list[AbortRecord], list[EvictionRecord]]:
        by_rid = {req.rid: req for req in live}
        named: dict[str, ViolationRow] = {}
        slots: set[int] = set()
        unknown_owner = False
        for row in pending.rows:
            if row.reasons & Reason.PADDED_ROW:
                continue  # a graph padding row: no live request read through it
            if row.reasons & CONTENT_REASONS and row.slot > 0:
                slots.add(row.slot)
            if row.check is CheckKind.SWEEP:
                continue
            rid = self._history.context(step=row.step, req_pool_idx=row.req_pool_idx).rid
            if rid is None:
                unknown_owner = True
            else:
                named.setdefault(rid, row)
        wholesale = None
        if pending.dropped:
            wholesale = AbortCause.RING_OVERFLOW
        elif unknown_owner:
            wholesale = AbortCause.UNKNOWN_OWNER
        aborts: list[AbortRecord] = []
        aborted: set[int] = set()

        def abort(req: Any, *, cause: AbortCause, row: ViolationRow | None) -> None:
            reasons = () if row is None else tuple(row.reason_labels)
            message = abort_message(reasons=reasons, position=None if row is None else row.position,
                                    step=None if row is None else row.step, cause=cause.value)
            delivered = len(req.output_ids)
            if abort_request(req, message=message):
                aborted.add(id(req))
                aborts.append(AbortRecord(
                    rid=req.rid, cause=cause, step=None if row is None else row.step,
                    check=None if row is None else row.check.name.lower(), reasons=reasons,
                    slot=None if row is None else row.slot,
                    position=None if row is None else row.position, tokens_delivered=delivered,
                ))

        cut_rids: list[str] = []
        targets: list[tuple[Any, int]] = []
        quarantine = self._quarantine
        for rid, row in named.items():
            req = by_rid.get(rid)
            if req is None:
                continue  # finished before its row arrived (its tokens have left)
            abort(req, cause=AbortCause.VIOLATION, row=row)
            if quarantine is not None:
                target = quarantine.target_for_position(last_node=getattr(req, "last_node", None),
                                                        position=row.position)
                if target is not None:
                    targets.append(target)
                    cut_rids.append(rid)
        if wholesale is not None:
            logger.warning(
                f"{CONTAINMENT_PREFIX} {pending.dropped} violation row(s) were dropped or a "
                "row's request is unknown: every live request is aborted and the radix cache "
                f"evicted (cause={wholesale.value})"
            )
            for req in live:
                abort(req, cause=wholesale, row=None)
        evictions: list[EvictionRecord] = []
        if quarantine is not None:
            if wholesale is not None:
                targets = quarantine.everything()
            else:
                targets += quarantine.targets_for_slots(slots)
            tops = quarantine.cut(targets)
            for req in live:
                if id(req) not in aborted and quarantine.holds(
                        last_node=getattr(req, "last_node", None), tops=tops):
                    abort(req, cause=AbortCause.CACHE, row=None)
            detached = quarantine.detach(tops)
            if detached.nodes:
                evictions.append(EvictionRecord(
                    cause=EvictionCause.RING_OVERFLOW if wholesale is not None
                    else EvictionCause.VIOLATION,
                    nodes=detached.nodes, tokens=detached.tokens,
                    locked_nodes=detached.locked_nodes,
                    slots=tuple(sorted(slots))[:_SLOTS_IN_RECORD], rids=tuple(cut_rids),
                ))
        return aborts, evictions
