"""Adapters on SGLang's hierarchical cache (``--enable-hierarchical-cache``): the canary's
records follow KV pages to host memory and back (:mod:`..runner.host_tier`).

The host pool and the cache controller carry their canary parts under one attribute each, set
when the scheduler's ``HiRadixCache`` is built; a host pool without one was not built by a
canary-covered scheduler and stops the server loudly (its loads would have no records).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.kv_canary.runner.canary_runner import runner_of

logger = logging.getLogger("sglang.srt.kv_canary")

HOST_TIER_ATTRIBUTE = "_kv_canary_host_tier"
HOST_FAULTS_ATTRIBUTE = "_kv_canary_host_faults"


def attach_host_tier(result: None, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.init_cache_with_memory_pool``: with a hierarchical cache, give its
    host pool the target canary's host-tier records (and its controller the host faults)."""
    tree_cache = scheduler.tree_cache
    if not getattr(scheduler, "enable_hierarchical_cache", False):
        return
    runner = runner_of(scheduler.tp_worker.model_runner)
    tier, faults = runner.attach_host_tier(tree_cache)
    controller = tree_cache.cache_controller
    setattr(controller.mem_pool_host, HOST_TIER_ATTRIBUTE, tier)
    setattr(controller, HOST_FAULTS_ATTRIBUTE, faults)


def _tier_of(host_pool: Any):
    tier = getattr(host_pool, HOST_TIER_ATTRIBUTE, None)
    if tier is None:
        raise RuntimeError(
            f"KV canary: the host KV pool {type(host_pool).__name__} has no canary records "
            "(it was not built by the scheduler's HiRadixCache); its loads cannot be checked"
        )
    return tier


def after_backup(result: None, host_pool: Any, device_pool: Any, host_indices: Any,
                 device_indices: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``{MHA,MLA}TokenToKVPoolHost.backup_from_device_all_layer(device_pool,
    host_indices, device_indices, io_backend)``, on SGLang's write stream: the slots' records
    follow the copy."""
    _tier_of(host_pool).on_backup(host_slots=host_indices, device_slots=device_indices)


def before_load_layer(host_pool: Any, device_pool: Any, host_indices: Any, device_indices: Any,
                      layer_id: int, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``{MHA,MLA}TokenToKVPoolHost.load_to_device_per_layer(device_pool, host_indices,
    device_indices, layer_id, io_backend)``: at layer 0, the load's indices (those every layer's
    copy uses) are captured for the next forward."""
    if layer_id == 0:
        _tier_of(host_pool).on_load_started(host_slots=host_indices, device_slots=device_indices)


def before_start_loading(controller: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``HiCacheController.start_loading()``: the host-tier faults act on the queued
    loads (their host copies, their device slots) before SGLang merges and copies them."""
    faults = getattr(controller, HOST_FAULTS_ATTRIBUTE, None)
    if faults is not None:
        faults.before_loading(load_queue=controller.load_queue,
                              host_pool=controller.mem_pool_host)


def refuse_storage_backend(original: Any, tree_cache: Any, *args: Any,
                           **kwargs: Any) -> tuple[bool, str]:
    """AROUND ``HiRadixCache.attach_storage_backend(...) -> (ok, message)``: an L3 storage
    backend attached at run time would load pages the canary never saw backed up; refused the
    way SGLang refuses an attach (``(False, why)``, logged), the server serves on without it."""
    message = ("the KV canary refuses a hierarchical-cache storage backend (L3): pages "
               "prefetched from storage carry no canary records")
    logger.warning(message)
    return False, message
