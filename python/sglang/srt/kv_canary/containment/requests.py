"""Finishing a live SGLang request with the canary's error, the way SGLang finishes its own
(``Req.to_finish``, read by ``Req.check_finished`` when the scheduler processes the request's
next result), and finding the live requests of a scheduler.

A request aborted here:

* gets ``to_finish = FINISH_ABORT(message, 500, "KVCanaryViolation")``: the tokenizer manager
  answers a non-streaming request with HTTP 500 and ``message``, a streaming one with a last
  chunk whose ``finish_reason`` is ``abort`` (OpenAI endpoints: an error chunk);
* gets ``finished_len = len(output_ids)``: the token the scheduler appends while processing the
  faulted forward's result is not sent (``Req.output_ids_through_stop``);
* gets ``skip_radix_cache_insert = True``: its KV is never inserted into the radix cache, also
  not by a chunked prefill's next chunk (SGLang's ``maybe_cache_unfinished_req`` and
  ``release_kv_cache`` read that flag). A request still in chunked prefill runs its remaining
  chunks before it finishes; SGLang stashes it between chunks with ``cache_unfinished_req``, which
  besides inserting moves ``req.prefix_indices`` past the computed chunk. The flag skips both, so
  the next chunk would recompute from the old prefix and leak the slots of the computed one:
  :func:`keep_computed_prefix` does the second part alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

KV_CANARY_ERROR_TYPE = "KVCanaryViolation"
ABORTED_ATTRIBUTE = "kv_canary_aborted"  # set on a Req this module aborted


def abort_message(*, reasons: tuple[str, ...], position: int | None, step: int | None,
                  cause: str) -> str:
    """The client's error text: names the KV canary and the reason."""
    if cause == "violation":
        where = f" at position {position}" if position is not None and position >= 0 else ""
        what = (f"KV-cache corruption detected in this request's forward ({'+'.join(reasons)}"
                f"{where}, step {step})")
    elif cause == "cache":
        what = "this request's cached prefix holds a KV-cache slot reported as corrupted"
    else:
        what = (f"KV-cache corruption detected, but its request is unknown ({cause}): every "
                "running request was aborted")
    return (f"KV canary: {what}; the request was aborted (SGLANG_KV_CANARY_ON_VIOLATION=abort). "
            "Retrying recomputes it")


def abort_request(req: Any, *, message: str) -> bool:
    """Finish ``req`` with the canary's error at its next result processing.

    Returns:
        False when it is already finished or already being finished (left as it is).
    """
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    if req.finished() or req.to_finish is not None:
        return False
    req.to_finish = FINISH_ABORT(message, HTTPStatus.INTERNAL_SERVER_ERROR, KV_CANARY_ERROR_TYPE)
    req.finished_len = len(req.output_ids)
    req.skip_radix_cache_insert = True
    setattr(req, ABORTED_ATTRIBUTE, True)
    return True


def is_aborted_here(req: Any) -> bool:
    """Whether :func:`abort_request` aborted ``req``."""
    return bool(getattr(req, ABORTED_ATTRIBUTE, False))


def keep_computed_prefix(req: Any, *, req_to_token: Any) -> None:
    """What stashing a chunked request does besides inserting into the radix cache: its
    ``prefix_indices`` become the KV slots of every token computed so far (``req.fill_ids``),
    so the next chunk continues after them. The slots stay the request's own (freed from
    ``cache_protected_len`` on when it finishes, as SGLang frees a request it does not insert)."""
    import torch

    computed = len(req.fill_ids)
    req.prefix_indices = req_to_token[req.req_pool_idx, :computed].to(torch.int64)


def live_requests(*, scheduler: Any, batch: Any = None) -> list[Any]:
    """The scheduler's requests that have run or are running a forward and are not finished:
    ``batch`` (the one whose result is processed), the running batch, the batch in flight
    (overlap schedule), the last batch, the chunked request. Waiting requests have read nothing
    and are left out. Each request once, in that order."""
    seen: set[int] = set()
    found: list[Any] = []
    for req in _candidates(scheduler=scheduler, batch=batch):
        if id(req) in seen or req.finished():
            continue
        seen.add(id(req))
        found.append(req)
    return found


def _candidates(*, scheduler: Any, batch: Any) -> Iterator[Any]:
    for holder in (batch, getattr(scheduler, "running_batch", None),
                   getattr(scheduler, "cur_batch", None), getattr(scheduler, "last_batch", None)):
        reqs = getattr(holder, "reqs", None)
        if reqs:
            yield from reqs
    chunked = getattr(scheduler, "chunked_req", None)
    if chunked is not None:
        yield chunked
