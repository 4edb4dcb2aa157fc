"""Building one scheduler's :class:`~.controller.Containment` once its prefix cache exists."""

from __future__ import annotations

from typing import Any

from sglang.srt.kv_canary.containment.controller import Containment
from sglang.srt.kv_canary.containment.quarantine import RadixQuarantine, supports_quarantine
from sglang.srt.kv_canary.errors import CanaryUnsupportedError

SCHEDULER_ATTRIBUTE = "kv_canary_containment"  # attribute of a Scheduler


def build_containment(*, runner: Any, tree_cache: Any) -> Containment:
    """The containment of the scheduler whose target canary is ``runner`` (a ``CanaryRunner`` in
    abort mode) and whose prefix cache is ``tree_cache``.

    Raises:
        CanaryUnsupportedError: a prefix cache abort mode cannot heal (SGLang's SWA,
            hierarchical or mamba radix caches); ``--disable-radix-cache`` has none to heal.
        RuntimeError: the runner has no inbox or forward history (not in abort mode).
    """
    if runner.containment_inbox is None or runner.forward_history is None:
        raise RuntimeError("KV canary abort mode: the runner has no containment inbox")
    quarantine = None
    if not _nothing_cached(tree_cache):
        if not supports_quarantine(tree_cache):
            raise CanaryUnsupportedError([
                f"SGLANG_KV_CANARY_ON_VIOLATION=abort cannot evict from the prefix cache "
                f"{type(tree_cache).__name__} (only SGLang's RadixCache); pass "
                "--disable-radix-cache, or use SGLANG_KV_CANARY_ON_VIOLATION=log or raise"
            ])
        quarantine = RadixQuarantine(tree_cache=tree_cache)
    sinks = [sink for sink in (runner.report_file, runner.metrics) if sink is not None]
    return Containment(inbox=runner.containment_inbox, history=runner.forward_history,
                       poll=runner.monitor.poll_settled, quarantine=quarantine, sinks=sinks)


def _nothing_cached(tree_cache: Any) -> bool:
    """No prefix is ever matched: SGLang's ``ChunkCache`` (``--disable-radix-cache``) or a
    disabled radix cache."""
    from sglang.srt.mem_cache.chunk_cache import ChunkCache

    return isinstance(tree_cache, ChunkCache) or bool(getattr(tree_cache, "disable", False))


def containment_of(scheduler: Any) -> Containment:
    """The containment :func:`build_containment` set on ``scheduler``.

    Raises:
        RuntimeError: none is set (the prefix-cache hook did not run).
    """
    containment = getattr(scheduler, SCHEDULER_ATTRIBUTE, None)
    if not isinstance(containment, Containment):
        raise RuntimeError("KV canary abort mode: this scheduler has no containment (the "
                           "Scheduler.init_cache_with_memory_pool hook did not run)")
    return containment
