"""Adapters of abort mode on SGLang's scheduler (``SGLANG_KV_CANARY_ON_VIOLATION=abort``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang.srt.kv_canary.containment.requests import (
    is_aborted_here,
    keep_computed_prefix,
    live_requests,
)
from sglang.srt.kv_canary.containment.setup import (
    SCHEDULER_ATTRIBUTE,
    build_containment,
    containment_of,
)
from sglang.srt.kv_canary.runner.canary_runner import runner_of


def attach_containment(result: None, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.init_cache_with_memory_pool``: the scheduler's containment, beside its
    prefix cache."""
    setattr(scheduler, SCHEDULER_ATTRIBUTE, build_containment(
        runner=runner_of(scheduler.tp_worker.model_runner), tree_cache=scheduler.tree_cache,
    ))


def before_batch_result(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.process_batch_result(batch, result)``: abort and evict what the rows
    of this batch's forward (and earlier ones) name, before its tokens are sent."""
    batch = args[0] if args else kwargs["batch"]
    result = args[1] if len(args) > 1 else kwargs["result"]
    containment_of(scheduler).before_batch_result(scheduler=scheduler, batch=batch,
                                                  result=result)


def after_batch_result(result: None, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.process_batch_result``: free the evicted nodes the finished requests
    released."""
    containment_of(scheduler).release()


def before_idle(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``SchedulerRuntimeCheckerMixin.on_idle``: act on rows read while idle and free the
    evicted nodes before SGLang's idle memory check counts the pool."""
    containment_of(scheduler).contain(live=live_requests(scheduler=scheduler))


def stash_chunked_request(original: Callable[..., Any], scheduler: Any, req: Any,
                          *args: Any, **kwargs: Any) -> Any:
    """AROUND ``Scheduler.stash_chunked_request(req)``: a request aborted mid chunked prefill
    keeps its computed chunk without inserting it into the radix cache
    (:func:`~..containment.requests.keep_computed_prefix`); any other request is stashed by
    SGLang."""
    if not is_aborted_here(req):
        return original(scheduler, req, *args, **kwargs)
    keep_computed_prefix(req, req_to_token=scheduler.req_to_token_pool.req_to_token)
    return None
