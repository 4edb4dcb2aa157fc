"""Abort mode leaks no KV slot: SGLang's own ``RadixCache``, ``TokenToKVPoolAllocator`` and
``ReqToTokenPool`` on the CPU, driven through the calls the scheduler makes for a request
(chunked prefill stashes, ``cache_finished_req``), with abort mode acting in between. What the
scheduler's idle check demands must hold once no request runs: every slot is free or held by
the tree (available + evictable == the pool's size).

A request aborted mid chunked prefill shows why the stash adapter exists: with SGLang's stash
skipped alone (what ``skip_radix_cache_insert`` does), its next chunk recomputes the last one
into new slots and the old ones leak."""

import sys

import pytest
import torch

from sglang.srt.kv_canary.containment.quarantine import RadixQuarantine
from sglang.srt.kv_canary.containment.requests import abort_request
from sglang.srt.kv_canary.hooks.containment import stash_chunked_request
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="kv-canary-cpu")

_SLOTS = 64


class _Server:
    """The pools, the allocator and the radix cache of one scheduler."""

    def __init__(self) -> None:
        self.req_to_token_pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu",
                                                enable_memory_saver=False)
        kv_pool = MHATokenToKVPool(_SLOTS, page_size=1, dtype=torch.bfloat16, head_num=1,
                                   head_dim=8, layer_num=1, device="cpu",
                                   enable_memory_saver=False, enable_alt_stream=False)
        self.allocator = TokenToKVPoolAllocator(_SLOTS, dtype=torch.bfloat16, device="cpu",
                                                kvcache=kv_pool, need_sort=False)
        self.tree = RadixCache(CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=1,
        ))
        self.req_to_token = self.req_to_token_pool.req_to_token

    def leaked(self) -> int:
        """Slots neither free nor held by the tree (what SGLang's idle check reports)."""
        return _SLOTS - self.allocator.available_size() - self.tree.evictable_size() \
            - self.tree.protected_size()


class _Req:
    """The fields of SGLang's Req that its radix cache and abort mode read and write."""

    def __init__(self, rid: str, prompt: list[int], *, row: int) -> None:
        self.rid, self.origin_input_ids, self.output_ids = rid, list(prompt), []
        self.req_pool_idx, self.extra_key, self.priority = row, None, 0
        self.fill_ids: list[int] = []
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.cache_protected_len = 0
        self.last_node = None
        self.kv_committed_len = 0
        self.to_finish = self.finished_reason = self.finished_len = None
        self.skip_radix_cache_insert = False

    def finished(self) -> bool:
        return self.finished_reason is not None

    def pop_committed_kv_cache(self) -> int:
        return self.kv_committed_len


def _match(server: _Server, req: _Req) -> None:
    """Admission: the cached prefix becomes the request's, locked."""
    match = server.tree.match_prefix(MatchPrefixParams(key=RadixKey(req.origin_input_ids, None)))
    req.prefix_indices = match.device_indices.to(torch.int64)
    req.cache_protected_len = len(req.prefix_indices)
    req.last_node = match.last_device_node
    server.tree.inc_lock_ref(req.last_node)
    server.req_to_token[req.req_pool_idx, :len(req.prefix_indices)] = req.prefix_indices.to(
        torch.int32)


def _run_chunk(server: _Server, req: _Req, *, end: int) -> None:
    """A prefill forward of positions ``len(prefix_indices)`` to ``end``: new slots, as
    ``PrefillAdder.add_chunked_req`` and ``prepare_for_extend`` give them."""
    start = len(req.prefix_indices)
    slots = server.allocator.alloc(end - start)
    server.req_to_token[req.req_pool_idx, start:end] = slots.to(torch.int32)
    req.fill_ids = req.origin_input_ids[:end]
    req.kv_committed_len = end


def _finish(server: _Server, req: _Req) -> None:
    """``release_kv_cache``: SGLang's ``cache_finished_req``, without insert when skipped."""
    server.tree.cache_finished_req(req, is_insert=not req.skip_radix_cache_insert)


class _Scheduler:
    def __init__(self, server: _Server) -> None:
        self.req_to_token_pool = server.req_to_token_pool


def _sglang_stash(server: _Server):
    """``Scheduler.stash_chunked_request``: ``maybe_cache_unfinished_req(chunked=True)``."""

    def stash(scheduler: object, req: _Req) -> None:
        if not req.skip_radix_cache_insert:
            server.tree.cache_unfinished_req(req, chunked=True)

    return stash


@pytest.mark.parametrize("adapter", [True, False], ids=["with the stash adapter", "without"])
def test_a_request_aborted_mid_chunked_prefill_leaks_no_slot(adapter: bool) -> None:
    server = _Server()
    req = _Req("chunked", list(range(100, 120)), row=1)
    _match(server, req)
    stash = _sglang_stash(server)
    scheduler = _Scheduler(server)
    _run_chunk(server, req, end=8)
    assert abort_request(req, message="KV canary: test")  # a row of the first chunk
    for end in (16, 20):
        if adapter:
            stash_chunked_request(stash, scheduler, req)
        else:
            stash(scheduler, req)
        _run_chunk(server, req, end=end)
    _finish(server, req)
    assert server.tree.evictable_size() == 0  # nothing of the aborted request was cached
    # without: each later chunk recomputes from the old prefix, leaking 8 + 16 slots
    assert server.leaked() == (0 if adapter else 8 + 16)


def test_a_quarantined_prefix_is_freed_once_its_aborted_reader_finishes() -> None:
    server = _Server()
    prompt = list(range(200, 210))
    writer = _Req("writer", prompt, row=1)
    _match(server, writer)
    _run_chunk(server, writer, end=len(prompt))
    _finish(server, writer)  # its prompt cached: 10 evictable slots
    assert server.tree.evictable_size() == 10 and server.leaked() == 0
    reader = _Req("reader", prompt + [7, 8, 9], row=2)
    _match(server, reader)
    assert len(reader.prefix_indices) == 10
    _run_chunk(server, reader, end=13)
    # a row: position 3 of the reader's cached prefix holds a flipped byte
    quarantine = RadixQuarantine(tree_cache=server.tree)
    assert abort_request(reader, message="KV canary: test")
    target = quarantine.target_for_position(last_node=reader.last_node, position=3)
    tops = quarantine.cut([target])
    assert quarantine.holds(last_node=reader.last_node, tops=tops)
    detached = quarantine.detach(tops)
    assert (detached.nodes, detached.tokens, detached.locked_nodes) == (1, 7, 1)
    rematch = server.tree.match_prefix(MatchPrefixParams(key=RadixKey(prompt, None)))
    assert len(rematch.device_indices) == 3  # positions 3.. recompute
    _finish(server, reader)
    quarantine.release()
    assert quarantine.pending_nodes == 0
    assert server.tree.evictable_size() == 3 and server.leaked() == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
