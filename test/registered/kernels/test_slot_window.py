"""Window slots (:class:`~sglang.jit_kernel.kv_canary.kernel_inputs.SlotWindow`): the Triton
launches against the torch reference, exactly, on a small hybrid pool.

The pool: record slots (the full sub-pool) and window slots (the sliding-window sub-pool) mapped
through a table, as SGLang's ``SWATokenToKVPoolAllocator`` does; real-data sources 0 and 1 are
indexed by record slot, 2 and 3 by window slot. The simulated scheduler frees the window slots of
positions that left a row's window (keeping a page of margin, as SGLang does) and hands them to
new tokens, so windows slide and window slots are reused. Clean runs report nothing; each fault
(an in-window slot freed, a window slot mapped twice, a windowed byte flipped in and out of the
window) is reported with its reason, or not at all out of the window.
"""

import random
import sys

import pytest
import torch

from _canary_sim import (
    INTERPRETER_DEVICES,
    TRITON_DEVICES,
    canary_impl,
    import_triton_modules,
    sweep_impl,
)
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_CONSUMED,
    COUNTER_VIOLATIONS,
    NUM_COUNTERS,
    RECORD_FIELDS,
    RING_ROW_FIELDS,
    ROW_POSITION,
    ROW_REASONS,
    ROW_SLOT,
    Reason,
)
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    RealDataSources,
    SlotWindow,
    SweepEntries,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=40, suite="kv-canary-cpu")
register_cuda_ci(est_time=20, suite="kv-canary-gpu")

WINDOW = 6
PAGE = 1
NUM_SLOTS = 96
NUM_WINDOW_SLOTS = 40
WORDS = 4
WINDOWED = 0b1100


class WindowPool:
    """A hybrid pool with canary state: full slots handed out in order, window slots from a
    free list; ``margin`` extra positions kept before each row's window."""

    def __init__(self, *, device: str, real_data: str, seed: int = 0, margin: int = PAGE) -> None:
        self.device = torch.device(device)
        self.rng = random.Random(seed)
        self.margin = margin
        generator = torch.Generator().manual_seed(seed)

        def words(rows: int) -> torch.Tensor:
            values = torch.randint(-(1 << 62), 1 << 62, (rows, WORDS), generator=generator)
            return values.to(self.device)

        self.sources = (words(NUM_SLOTS), words(NUM_SLOTS),
                        words(NUM_WINDOW_SLOTS), words(NUM_WINDOW_SLOTS))
        real = None
        if real_data != "none":
            real = RealDataSources(sources=self.sources, partial=real_data == "partial")
        self.table = torch.zeros(NUM_SLOTS + 1, dtype=torch.int64, device=self.device)
        self.table[-1] = -1  # SGLang's trailing entry
        window = SlotWindow(
            slot_table=self.table,
            owners=torch.zeros(NUM_WINDOW_SLOTS, dtype=torch.int64, device=self.device),
            window=WINDOW, windowed_sources=WINDOWED if real is not None else 0,
        )

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=self.device)

        self.state = CanaryDeviceState(
            records=zeros(NUM_SLOTS, RECORD_FIELDS),
            req_to_token=torch.zeros((4, 64), dtype=torch.int32, device=self.device),
            ring=zeros(256, RING_ROW_FIELDS), counters=zeros(NUM_COUNTERS),
            owner_chains=zeros(4), real_data=real, window=window,
        )
        self.next_slot = 1
        self.free_window = list(range(1, NUM_WINDOW_SLOTS))
        self.rng.shuffle(self.free_window)
        self.hand_out_next: list[int] = []  # window slots the next allocations take first
        self.lengths: dict[int, int] = {}
        self.freed_before: dict[int, int] = {}
        self.step = 0

    def slot(self, rp: int, position: int) -> int:
        return int(self.state.req_to_token[rp, position])

    def _allocate(self, rp: int, count: int) -> list[int]:
        start = self.lengths.get(rp, 0)
        slots = list(range(self.next_slot, self.next_slot + count))
        self.next_slot += count
        self.state.req_to_token[rp, start:start + count] = torch.tensor(slots, dtype=torch.int32)
        for slot in slots:
            self.table[slot] = (self.hand_out_next.pop() if self.hand_out_next
                                else self.free_window.pop())
        self.lengths[rp] = start + count
        return slots

    def _free_out_of_window(self, rp: int, prefix: int) -> None:
        """Free the window slots of positions before ``prefix - WINDOW - margin``."""
        start = self.freed_before.get(rp, 0)
        end = max(start, prefix - WINDOW - self.margin)
        for position in range(start, end):
            slot = self.slot(rp, position)
            self.free_window.append(int(self.table[slot]))
            self.table[slot] = 0
        self.freed_before[rp] = end

    def batch(self, rows: list[tuple[int, int]], *, layout: BatchLayout) -> CanaryBatchView:
        """Allocate and describe one forward: ``(req_pool_index, new tokens)`` per row."""
        ids, positions, locs, prefixes, counts = [], [], [], [], []
        for rp, count in rows:
            prefix = self.lengths.get(rp, 0)
            self._free_out_of_window(rp, prefix)
            locs += self._allocate(rp, count)
            positions += list(range(prefix, prefix + count))
            ids += [(rp * 1000 + p) % 4096 for p in range(prefix, prefix + count)]
            prefixes.append(prefix)
            counts.append(count)

        def i64(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        def i32(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        extend = layout is BatchLayout.EXTEND
        starts = [sum(counts[:i]) for i in range(len(counts))]
        return CanaryBatchView(
            layout=layout, req_pool_indices=i64([rp for rp, _ in rows]),
            seq_lens=i64([p + n for p, n in zip(prefixes, counts)]),
            extend_prefix_lens=i32(prefixes) if extend else None,
            extend_seq_lens=i32(counts) if extend else None,
            extend_start_loc=i32(starts) if extend else None,
            input_ids=i64(ids), positions=i64(positions), out_cache_loc=i64(locs),
        )

    def model_writes(self, batch: CanaryBatchView) -> None:
        """The model's K/V writes: new words in every source's row of each written slot."""
        generator = torch.Generator().manual_seed(100 + self.step)
        self.step += 1
        for slot in batch.out_cache_loc.tolist():
            for index, words in enumerate(self.sources):
                row = int(self.table[slot]) if WINDOWED >> index & 1 else slot
                values = torch.randint(-(1 << 62), 1 << 62, (WORDS,), generator=generator)
                words[row] = values.to(self.device)


def clone(state: CanaryDeviceState) -> CanaryDeviceState:
    """A copy of the canary's own tensors (the pool's sources and table are shared)."""
    window = state.window
    return CanaryDeviceState(
        records=state.records.clone(), req_to_token=state.req_to_token,
        ring=state.ring.clone(), counters=state.counters.clone(),
        owner_chains=state.owner_chains.clone(), real_data=state.real_data,
        window=SlotWindow(slot_table=window.slot_table, owners=window.owners.clone(),
                          window=window.window, windowed_sources=window.windowed_sources),
    )


def _ring_rows(state: CanaryDeviceState) -> list[tuple[int, ...]]:
    ring = state.ring.cpu()
    return sorted(map(tuple, ring[ring.ne(0).any(dim=1)][:, :-1].tolist()))


def assert_same(expected: CanaryDeviceState, actual: CanaryDeviceState) -> None:
    assert torch.equal(expected.records.cpu(), actual.records.cpu()), "records differ"
    assert torch.equal(expected.window.owners.cpu(), actual.window.owners.cpu()), \
        "window owners differ"
    assert torch.equal(expected.counters.cpu(), actual.counters.cpu()), "counters differ"
    assert _ring_rows(expected) == _ring_rows(actual), "ring rows differ"


class Twin:
    """The reference and the kernel run side by side on copies of one pool's canary state."""

    def __init__(self, pool: WindowPool, device: str) -> None:
        self.pool = pool
        self.ref = canary_impl("reference")
        self.kernel = canary_impl("triton")
        self.ref_state = clone(pool.state)
        self.kernel_state = pool.state
        self.device = device

    def forward(self, rows: list[tuple[int, int]], *, layout: BatchLayout,
                before_post=None) -> None:
        batch = self.pool.batch(rows, layout=layout)
        self.ref.launch_pre_forward(state=self.ref_state, batch=batch)
        self.kernel.launch_pre_forward(state=self.kernel_state, batch=batch)
        self.pool.model_writes(batch)
        if before_post is not None:
            before_post()
        self.ref.launch_post_forward(state=self.ref_state, batch=batch)
        self.kernel.launch_post_forward(state=self.kernel_state, batch=batch)
        assert_same(self.ref_state, self.kernel_state)

    def sweep(self, slots: list[int], positions: list[int], prev_slots: list[int]) -> None:
        def i64(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.pool.device)

        entries = SweepEntries(slots=i64(slots), prev_slots=i64(prev_slots),
                               positions=i64(positions), tokens=i64([-1] * len(slots)))
        sweep_impl("reference").launch_sweep(state=self.ref_state, entries=entries)
        sweep_impl("triton").launch_sweep(state=self.kernel_state, entries=entries)
        assert_same(self.ref_state, self.kernel_state)

    def violations(self) -> list[tuple[int, int, int]]:
        """(reasons, slot, position) of every unconsumed ring row (reference's)."""
        state = self.ref_state
        produced = int(state.counters[COUNTER_VIOLATIONS])
        consumed = int(state.counters[COUNTER_CONSUMED])
        ring = state.ring.cpu()
        return sorted(
            (int(ring[n % ring.shape[0], ROW_REASONS]), int(ring[n % ring.shape[0], ROW_SLOT]),
             int(ring[n % ring.shape[0], ROW_POSITION]))
            for n in range(consumed, produced)
        )


@pytest.fixture(params=INTERPRETER_DEVICES + TRITON_DEVICES)
def device(request) -> str:
    import_triton_modules()
    return request.param


def _serve(twin: Twin, *, decode_steps: int, before_post_at=None) -> None:
    """Two prompts longer than the window, then decode steps: windows slide, window slots are
    freed and reused."""
    twin.forward([(1, 9), (2, 4)], layout=BatchLayout.EXTEND)
    twin.forward([(2, 7)], layout=BatchLayout.EXTEND)  # a chunked prefill's second chunk
    for step in range(decode_steps):
        hook = before_post_at.get(step) if before_post_at else None
        twin.forward([(1, 1), (2, 1)], layout=BatchLayout.DECODE, before_post=hook)


@pytest.mark.parametrize("real_data", ["none", "partial", "all"])
def test_sliding_windows_that_free_and_reuse_window_slots_stay_clean(device, real_data) -> None:
    pool = WindowPool(device=device, real_data=real_data)
    twin = Twin(pool, device)
    _serve(twin, decode_steps=14)
    assert len(pool.free_window) > 0 and pool.freed_before[1] > 0  # windows slid
    assert twin.violations() == []


def test_an_in_window_slot_without_a_window_slot_is_reported(device) -> None:
    pool = WindowPool(device=device, real_data="none")
    twin = Twin(pool, device)
    _serve(twin, decode_steps=3)
    lost = pool.slot(1, pool.lengths[1] - 2)  # inside row 1's window
    pool.table[lost] = 0
    twin.forward([(1, 1)], layout=BatchLayout.DECODE)
    rows = twin.violations()
    assert rows and all(reasons == int(Reason.VERIFY_WINDOW_UNMAPPED) and slot == lost
                        for reasons, slot, _ in rows)


def test_a_window_slot_handed_to_a_second_slot_is_reported(device) -> None:
    pool = WindowPool(device=device, real_data="none")
    twin = Twin(pool, device)
    _serve(twin, decode_steps=3)
    victim = pool.slot(1, pool.lengths[1] - 3)
    stolen = int(pool.table[victim])
    pool.hand_out_next.append(stolen)  # the allocator frees it while row 1 still reads it
    twin.forward([(2, 1)], layout=BatchLayout.DECODE)  # row 2's new token takes it
    assert int(pool.table[pool.slot(2, pool.lengths[2] - 1)]) == stolen
    twin.forward([(1, 1)], layout=BatchLayout.DECODE)
    rows = twin.violations()
    assert (int(Reason.VERIFY_WINDOW_OWNER), victim, pool.lengths[1] - 4) in rows
    assert all(reasons == int(Reason.VERIFY_WINDOW_OWNER) for reasons, _, _ in rows)


@pytest.mark.parametrize("real_data", ["partial", "all"])
def test_a_flipped_windowed_byte_is_reported_inside_the_window_only(device, real_data) -> None:
    pool = WindowPool(device=device, real_data=real_data, margin=4)
    twin = Twin(pool, device)
    _serve(twin, decode_steps=2)
    length = pool.lengths[1]
    inside, outside = pool.slot(1, length - 2), pool.slot(1, length - WINDOW - 2)
    assert int(pool.table[outside]) != 0  # still allocated (the margin), but out of the window

    def flip() -> None:
        for slot in (inside, outside):
            pool.sources[3][int(pool.table[slot]), 0] ^= 1 << 5

    twin.forward([(1, 1)], layout=BatchLayout.DECODE, before_post=flip)
    for _ in range(2 * 4):  # partial: each source's lane comes due within four forwards
        twin.forward([(1, 1)], layout=BatchLayout.DECODE)
    rows = twin.violations()
    assert rows and {slot for _, slot, _ in rows} == {inside}
    assert all(reasons == int(Reason.VERIFY_REAL_KV) for reasons, _, _ in rows)


@pytest.mark.parametrize("real_data", ["partial", "all"])
def test_a_flipped_full_sub_pool_byte_is_reported_outside_the_window_too(device, real_data) -> None:
    pool = WindowPool(device=device, real_data=real_data)
    twin = Twin(pool, device)
    _serve(twin, decode_steps=4)
    early = pool.slot(1, 1)
    assert int(pool.table[early]) == 0  # its window slot is gone

    def flip() -> None:
        pool.sources[0][early, 1] ^= 1 << 9

    twin.forward([(1, 1)], layout=BatchLayout.DECODE, before_post=flip)
    for _ in range(4):
        twin.forward([(1, 1)], layout=BatchLayout.DECODE)
    rows = twin.violations()
    assert rows and {slot for _, slot, _ in rows} == {early}
    assert all(reasons == int(Reason.VERIFY_REAL_KV) for reasons, _, _ in rows)


@pytest.mark.parametrize("real_data", ["none", "partial", "all"])
def test_the_sweep_checks_live_window_slots_and_skips_freed_ones(device, real_data) -> None:
    pool = WindowPool(device=device, real_data=real_data)
    twin = Twin(pool, device)
    _serve(twin, decode_steps=6)
    length = pool.lengths[1]
    slots = [pool.slot(1, p) for p in range(length)]
    prev = [-1] + slots[:-1]
    twin.sweep(slots, list(range(length)), prev)
    assert twin.violations() == []  # freed window slots (early positions) are skipped
    reused = slots[-2]
    twin.ref_state.window.owners[int(pool.table[reused])] = 7
    twin.kernel_state.window.owners[int(pool.table[reused])] = 7
    twin.sweep(slots, list(range(length)), prev)
    assert twin.violations() == [(int(Reason.VERIFY_WINDOW_OWNER), reused, length - 2)]


def test_a_slot_window_names_its_bad_field() -> None:
    table = torch.zeros(8, dtype=torch.int64)
    owners = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="SlotWindow.window"):
        SlotWindow(slot_table=table, owners=owners, window=-1)
    with pytest.raises(ValueError, match="windowed_sources"):
        SlotWindow(slot_table=table, owners=owners, window=4, windowed_sources=1 << 4)
    with pytest.raises(TypeError, match="slot_table"):
        SlotWindow(slot_table=table.to(torch.int32), owners=owners, window=4)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
