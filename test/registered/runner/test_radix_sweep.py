"""The radix sweep over SGLang's real ``RadixCache`` on CPU, with the torch reference sweep kernel.

Requests run through the real :class:`CanaryRunner` on the self-check's simulated server (SGLang's
``ReqToTokenPool``, ``MHATokenToKVPool`` and allocator), so their records are the ones the
runner wrote; each finished request is inserted into a real ``RadixCache`` the way SGLang's
``cache_finished_req`` does (its tokens and its ``req_to_token`` slots). Then:

* a clean tree sweeps clean; the sweep's launches and slots are counted (stats line, exact
  health check);
* a corrupted K/V byte or record of a cached slot that no running request uses is reported with
  ``check=sweep`` (and only by the sweep), also when the ``real_kv_unused_cache`` perturbation
  injects it;
* a pass bounded to a few slots per step spreads over several steps and covers every cached slot
  exactly once;
* nodes evicted from the tree while a pass runs are skipped (their slots may hold anything).
"""

import logging
import random
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_ENTRIES,
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    COUNTER_VIOLATIONS,
    FIELD_TOKEN_POSITION,
    ROW_INDEX,
    CheckKind,
    Reason,
    pack_token_position,
    unpack_position,
    unpack_token,
)
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, PerturbConfig, RealDataMode
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX
from sglang.srt.kv_canary.monitor.stats import STATS_LINE_RE
from sglang.srt.kv_canary.monitor.violations import ViolationRow, find_violation_rows
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.perturb.real_kv_unused_cache import RealKvUnusedCachePerturbation
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.pools.mha import MHACanaryPool
from sglang.srt.kv_canary.runner.radix_sweep import RadixSweep
from sglang.srt.kv_canary.selfcheck.scenarios import server_hooks, install_canary_runner
from sglang.srt.kv_canary.selfcheck.simulation import (
    SimulatedModelRunner,
    SimulatedRequest,
    SimulatedServer,
)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.chunk_cache import ChunkCache
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="kv-canary-cpu")

_KERNELS = load_kernels(KernelBackend.TORCH_REFERENCE)
_SHARED = [7, 8, 9, 10, 11, 12, 13, 14]  # the first 8 prompt tokens of A and B


class _Setup:
    """A simulated server under the canary, with a real RadixCache attached to the runner."""

    def __init__(self, *, page_size: int, config: CanaryConfig, eagle: bool = False) -> None:
        def forward(batch):
            return around_forward(SimulatedModelRunner.forward, self.server.runner, batch)

        self.page_size = page_size
        self.server = SimulatedServer(
            page_size=page_size, num_pages=256 // page_size, max_requests=8,
            max_context_len=64, forward=forward, hooks=server_hooks(config),
        )
        self.runner: CanaryRunner = install_canary_runner(
            model_runner=self.server.runner, config=config, kernels=_KERNELS
        )
        self.tree = RadixCache(CacheInitParams(
            disable=False, req_to_token_pool=self.server.req_to_token_pool,
            token_to_kv_pool_allocator=self.server.allocator, page_size=page_size,
            is_eagle=eagle,
        ))
        self.runner.attach_radix_cache(self.tree)
        self.rid = 0

    def run(self, prompt: list[int], *, new_tokens: int = 3, cache: bool = True,
            finish: bool = True) -> SimulatedRequest:
        """Prefill, decode, then (as SGLang's cache_finished_req) insert the request's tokens
        whose K/V is cached and their slots into the tree, and finish it."""
        self.rid += 1
        request = SimulatedRequest(rid=f"q{self.rid}", prompt=list(prompt),
                                   max_new_tokens=new_tokens)
        self.server.admit(request)
        self.server.extend([(request, len(request.prompt) - request.kv_len)])
        while not request.finished:
            self.server.decode([request])
        if cache:
            slots = self.server.req_to_token_pool.req_to_token[request.req_pool_idx]
            self.tree.insert(InsertParams(
                key=RadixKey(token_ids=request.tokens[: request.kv_len]),
                value=slots[: request.kv_len].to(torch.int64),
            ))
        if finish:
            self.server.finish(request)
        return request

    def populate(self) -> None:
        """A, B (sharing A's first 8 tokens: the tree splits) and C (unrelated)."""
        self.run(_SHARED + [21, 22, 23, 24, 25, 26, 27, 28])
        self.run(_SHARED + [31, 32, 33, 34, 35])
        self.run([41, 42, 43, 44, 45, 46, 47, 48, 49, 50])

    @property
    def state(self):
        return self.runner.state

    def counter(self, index: int) -> int:
        return int(self.state.counters[index])


def _config(*, sweep_interval: int, real_data: RealDataMode = RealDataMode.ALL,
            **perturb: float) -> CanaryConfig:
    return CanaryConfig(
        mode=CanaryMode.LOG, real_data=real_data, sweep_interval=sweep_interval,
        stats_print_every_n_steps=4, health_check_every_n_steps=4,
        perturb=PerturbConfig(warmup_steps=0, seed=11, **perturb),
    )


def _nodes(tree: RadixCache) -> list:
    """Every node of the tree but the root."""
    nodes, stack = [], list(tree.root_node.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


def _cached_slots(tree: RadixCache) -> dict[int, tuple[int, int]]:
    """slot -> (position, token) of every slot the tree holds (from the tree itself)."""
    held = {}
    for node in _nodes(tree):
        depth, parent = 0, node.parent
        while parent is not tree.root_node:
            depth += len(parent.key)
            parent = parent.parent
        for offset, (slot, token) in enumerate(zip(node.value.tolist(), node.key.token_ids)):
            held[slot] = (depth + offset, token)
    return held


def _ring_rows(state, *, since: int) -> list[ViolationRow]:
    """The rows of violation indices ``[since, count)`` (the ring is large enough here)."""
    capacity = state.ring.shape[0]
    count = int(state.counters[COUNTER_VIOLATIONS])
    rows = []
    for index in range(since, count):
        raw = state.ring[index % capacity].tolist()
        assert raw[ROW_INDEX] == index
        rows.append(ViolationRow.from_ring_row(raw))
    return rows


@pytest.fixture
def canary_log(caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    return caplog


# ----------------------------------------------------------------------------- through the runner


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_clean_tree_sweeps_clean_and_every_launch_is_counted(page_size, canary_log) -> None:
    setup = _Setup(page_size=page_size, config=_config(sweep_interval=3))
    setup.populate()
    held = _cached_slots(setup.tree)
    assert len(held) >= 24 and len(setup.tree.root_node.children) == 2  # A/B split, C
    sweep_runs = setup.counter(COUNTER_KERNEL_RUNS + CheckKind.SWEEP)
    swept = setup.counter(COUNTER_ENTRIES + CheckKind.SWEEP)
    for _ in range(4):  # a request that shares nothing; the tree stays as it is
        setup.run([60 + i for i in range(9)], new_tokens=3, cache=False)
    setup.runner.on_idle()
    runs = setup.counter(COUNTER_KERNEL_RUNS + CheckKind.SWEEP) - sweep_runs
    assert runs >= 4  # a pass every 3 steps, each one launch (far below 32768 slots)
    assert setup.counter(COUNTER_ENTRIES + CheckKind.SWEEP) - swept == runs * len(held)
    assert setup.counter(COUNTER_KERNEL_RUNS + CheckKind.SWEEP) == setup.runner.accounting.sweep_launches
    assert find_violation_rows(canary_log.text) == []
    stats = [m for m in map(STATS_LINE_RE.search, canary_log.messages) if m]
    assert stats and int(stats[-1]["sweeps"]) > 0 and int(stats[-1]["swept"]) > 0
    # the health check compared the sweep's run counter with the host's sweep launches, exactly
    health = [m for m in canary_log.messages if m.startswith(HEALTH_OK_PREFIX)]
    assert health and all(", sweep " in line for line in health)
    assert int(health[-1].rsplit(", sweep ", 1)[1]) > 0


def test_an_eagle_tree_of_bigram_keys_sweeps_clean_and_finds_a_wrong_token(canary_log) -> None:
    """With EAGLE SGLang keys the tree by bigrams: a node of ``n`` slots holds ``n + 1`` raw
    tokens (the last is the next node's first). Slot ``i`` still holds token ``i``."""
    setup = _Setup(page_size=1, config=_config(sweep_interval=2), eagle=True)
    setup.populate()
    nodes = _nodes(setup.tree)
    assert all(len(n.key.token_ids) == len(n.value) + 1 for n in nodes if len(n.value))
    cached = sum(len(n.value) for n in nodes)
    swept = setup.counter(COUNTER_ENTRIES + CheckKind.SWEEP)
    setup.run([60 + i for i in range(9)], new_tokens=3, cache=False)
    setup.runner.on_idle()
    assert setup.counter(COUNTER_ENTRIES + CheckKind.SWEEP) - swept >= cached
    assert find_violation_rows(canary_log.text) == []
    # A and B share 8 tokens but only 7 bigrams: A's own node starts at position 7
    a_suffix = next(n for n in nodes if n.key.token_ids[:2] == [_SHARED[-1], 21])
    slot = int(a_suffix.value[3])  # position 10, token 23
    _corrupt(setup, how="record_token", slot=slot)
    for _ in range(2):
        setup.run([70 + i for i in range(9)], new_tokens=3, cache=False)
    setup.runner.on_idle()
    rows = find_violation_rows(canary_log.text)
    assert {(row.slot, row.position, row.expected_token, row.reasons) for row in rows
            if row.reasons & int(Reason.VERIFY_TOKEN)} == {(slot, 10, 23, int(Reason.VERIFY_TOKEN))}


def _corrupt(setup: _Setup, *, how: str, slot: int) -> None:
    if how == "kv_byte":
        FingerprintedBytes(pool=MHACanaryPool(setup.server.kv_pool)).flip(
            slot=torch.tensor([slot]), rng=random.Random(5)
        )
    else:  # the record says another token was stored there
        packed = int(setup.state.records[slot, FIELD_TOKEN_POSITION])
        setup.state.records[slot, FIELD_TOKEN_POSITION] = pack_token_position(
            token=unpack_token(packed) + 1, position=unpack_position(packed)
        )


@pytest.mark.parametrize("how", ["kv_byte", "record_token"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_corrupt_cached_unused_slot_is_reported_by_the_sweep_only(how, page_size,
                                                                    canary_log) -> None:
    setup = _Setup(page_size=page_size, config=_config(sweep_interval=2))
    setup.populate()
    held = _cached_slots(setup.tree)
    # a slot in the middle of A's own suffix (no running request reads it from now on)
    a_suffix = next(n for n in _nodes(setup.tree) if n.key.token_ids[:1] == [21])
    slot = int(a_suffix.value[2])
    position, token = held[slot]
    assert position == 10 and token == 23
    _corrupt(setup, how=how, slot=slot)
    first_step = setup.counter(COUNTER_STEP)
    for _ in range(2):
        setup.run([60 + i for i in range(9)], new_tokens=3, cache=False)
    setup.runner.on_idle()
    rows = find_violation_rows(canary_log.text)
    assert rows and {row.check for row in rows} == {CheckKind.SWEEP}  # per-forward: silent
    assert all(row.req_pool_idx == 0 and row.step > first_step for row in rows)
    if how == "kv_byte":
        expected = {(slot, position, int(Reason.VERIFY_REAL_KV))}
    else:  # the token differs from the key; the next slot's chain no longer follows it
        next_slot = int(a_suffix.value[3])
        expected = {(slot, position, int(Reason.VERIFY_TOKEN)),
                    (next_slot, position + 1, int(Reason.VERIFY_CHAIN))}
    assert {(row.slot, row.position, row.reasons) for row in rows} == expected
    sweep_row = next(row for row in rows if row.slot == slot)
    assert sweep_row.stored_token == (token + 1 if how == "record_token" else token)
    assert sweep_row.expected_token == token  # the token the tree's key holds


def test_the_unused_cache_perturbation_is_caught_by_the_sweep(canary_log) -> None:
    setup = _Setup(page_size=1, config=_config(sweep_interval=3,
                                               real_kv_unused_cache_prob=1.0))
    setup.populate()
    for _ in range(3):
        setup.run([60 + i for i in range(9)], new_tokens=3, cache=False)
    setup.runner.on_idle()
    faults = [m for m in map(PERTURB_LINE_RE.search, canary_log.messages) if m]
    assert faults and all(f["fault"] == "real_kv_unused_cache" for f in faults)
    rows = find_violation_rows(canary_log.text)
    assert {row.check for row in rows} == {CheckKind.SWEEP}
    assert all(row.reasons == int(Reason.VERIFY_REAL_KV) for row in rows)
    held = _cached_slots(setup.tree)
    for fault in faults:  # each flip is at a cached slot, reported at its position
        step, position = int(fault["step"]), int(fault["position"])
        assert any(row.position == position and held[row.slot][0] == position
                   and row.step >= step for row in rows), fault.group(0)


def test_the_unused_cache_perturbation_flips_one_byte_of_an_unlocked_leaf() -> None:
    """``real_kv_unused_cache`` picks a slot of a leaf no request holds (``lock_ref == 0``) and
    names its position in the tree (node depth + offset); locked leaves are never touched."""
    setup = _Setup(page_size=1, config=_config(sweep_interval=0))
    setup.populate()
    held = _cached_slots(setup.tree)
    leaves = [n for n in _nodes(setup.tree) if not n.children]
    locked = leaves[0]
    setup.tree.inc_lock_ref(locked)  # a running request holds this path
    pool = setup.server.kv_pool
    views = [b[layer].view(b[layer].shape[0], -1).view(torch.uint8)
             for layer in (0, pool.layer_num - 1) for b in (pool.k_buffer, pool.v_buffer)]
    canary_pool = MHACanaryPool(pool)
    perturbation = RealKvUnusedCachePerturbation(kv_bytes=FingerprintedBytes(pool=canary_pool),
                                                 pool=canary_pool)
    chosen = set()
    for seed in range(12):
        before = [view.clone() for view in views]
        fault = perturbation.inject_into_cache(tree_cache=setup.tree, rng=random.Random(seed))
        changed = [(v != b).nonzero().tolist() for v, b in zip(views, before)]
        ((slot, _),) = [where for c in changed for where in c]  # exactly one byte
        assert slot not in locked.value.tolist()
        assert held[slot][0] == fault.position
        assert "persistent=1" in fault.detail
        chosen.add(slot)
    assert len(chosen) > 1
    for leaf in leaves:  # every leaf locked: nothing to corrupt
        if leaf is not locked:
            setup.tree.inc_lock_ref(leaf)
    assert perturbation.inject_into_cache(tree_cache=setup.tree, rng=random.Random(0)) is None


def test_the_sweep_needs_sglangs_radix_cache() -> None:
    setup = _Setup(page_size=1, config=_config(sweep_interval=1))
    chunk_cache = ChunkCache.__new__(ChunkCache)
    with pytest.raises(CanaryUnsupportedError, match="--disable-radix-cache"):
        setup.runner.attach_radix_cache(chunk_cache)
    off = _Setup(page_size=1, config=_config(sweep_interval=0))
    off.runner.attach_radix_cache(chunk_cache)  # the sweep off: any cache is fine
    assert off.runner.sweep is None


# ----------------------------------------------------------------------------- the pass itself


def _sweep(setup: _Setup, *, slots_per_step: int, interval: int = 1) -> RadixSweep:
    return RadixSweep(tree_cache=setup.tree, state=setup.state,
                      pool=MHACanaryPool(setup.server.kv_pool), launch=_KERNELS.sweep,
                      interval=interval, slots_per_step=slots_per_step)


def test_a_slot_bounded_pass_spreads_over_several_steps() -> None:
    setup = _Setup(page_size=1, config=_config(sweep_interval=0))
    setup.populate()
    held = _cached_slots(setup.tree)
    largest = max(len(node.value) for node in _nodes(setup.tree))
    sweep = _sweep(setup, slots_per_step=6, interval=100)
    entries = setup.counter(COUNTER_ENTRIES + CheckKind.SWEEP)
    violations = setup.counter(COUNTER_VIOLATIONS)
    assert sweep.after_forward(step=1) is None  # no pass starts off the interval
    steps = []
    step = 100
    while True:
        result = sweep.after_forward(step=step)
        steps.append(result)
        assert result.slots <= max(6, largest)  # a node larger than the bound goes whole
        step += 1
        if result.pass_done:
            break
    assert len(steps) >= 4 and sweep.passes_started == sweep.passes_done == 1
    assert sum(s.slots for s in steps) == len(held)  # every cached slot, once
    assert sum(s.nodes for s in steps) == len(_nodes(setup.tree))
    assert sweep.launches == sum(1 for s in steps if s.slots)
    assert setup.counter(COUNTER_KERNEL_RUNS + CheckKind.SWEEP) == sweep.launches
    assert setup.counter(COUNTER_ENTRIES + CheckKind.SWEEP) - entries == len(held)
    assert setup.counter(COUNTER_VIOLATIONS) == violations  # clean
    assert sweep.after_forward(step=step) is None  # the next pass waits for the interval
    assert sweep.after_forward(step=200).pass_done is False and sweep.pass_running


def test_nodes_evicted_during_a_pass_are_skipped() -> None:
    setup = _Setup(page_size=1, config=_config(sweep_interval=0))
    setup.populate()
    root = setup.tree.root_node
    shared, c_node = list(root.children.values())  # insertion order: A's (split) path, then C
    b_suffix = next(n for n in shared.children.values() if n.key.token_ids[0] == 31)
    a_suffix = next(n for n in shared.children.values() if n.key.token_ids[0] == 21)
    sweep = _sweep(setup, slots_per_step=1)  # one node per step
    since = setup.counter(COUNTER_VIOLATIONS)
    first = sweep.after_forward(step=1)  # the pass starts: C (last stacked) is verified
    assert first.slots == len(c_node.value)
    second = sweep.after_forward(step=2)  # the shared node; both suffixes are stacked now
    assert second.slots == len(shared.value) and sweep.pass_running
    # B's suffix is evicted from the tree (made the least recently used leaf); its slots go
    # back to the allocator and may hold anything: here, records of other positions
    b_suffix.last_access_time = a_suffix.last_access_time - 1
    evicted = setup.tree.evict(EvictParams(num_tokens=1)).num_tokens_evicted
    assert evicted == len(b_suffix.value)
    assert b_suffix not in shared.children.values() and a_suffix in shared.children.values()
    setup.state.records[b_suffix.value.to(torch.int64), FIELD_TOKEN_POSITION] = 12345
    rest = []
    while sweep.pass_running:
        rest.append(sweep.after_forward(step=3 + len(rest)))
    assert sum(s.slots for s in rest) == len(a_suffix.value)  # B's suffix skipped
    assert sum(s.nodes for s in rest) == 1
    assert _ring_rows(setup.state, since=since) == []
    # the evicted slots are garbage indeed: a pass that did visit them would have reported
    setup.state.records[a_suffix.value[:1].to(torch.int64), FIELD_TOKEN_POSITION] = 12345
    sweep = _sweep(setup, slots_per_step=1000)
    sweep.after_forward(step=1)
    rows = _ring_rows(setup.state, since=since)
    assert {row.slot for row in rows} >= {int(a_suffix.value[0])}
    assert not {row.slot for row in rows} & set(b_suffix.value.tolist())


def test_the_whole_tree_evicted_mid_pass_leaves_nothing_to_verify() -> None:
    setup = _Setup(page_size=1, config=_config(sweep_interval=0))
    setup.populate()
    held = _cached_slots(setup.tree)
    sweep = _sweep(setup, slots_per_step=1)
    since = setup.counter(COUNTER_VIOLATIONS)
    sweep.after_forward(step=1)
    setup.tree.evict(EvictParams(num_tokens=10**6))
    assert not setup.tree.root_node.children
    setup.state.records[torch.tensor(list(held), dtype=torch.int64)] = 0  # slots reused
    result = sweep.after_forward(step=2)
    assert (result.slots, result.nodes, result.pass_done) == (0, 0, True)
    assert _ring_rows(setup.state, since=since) == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
