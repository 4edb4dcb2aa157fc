"""Perturbation choices on real SGLang pools: seeded, only after the warm-up, only live prefix
entries, never an ``out_cache_loc`` slot, exactly one entry or byte changed, undone exactly."""

import logging
import random
import sys

import pytest
import torch

from sglang.jit_kernel.kv_canary.hashing import due_source_scalar
from sglang.srt.kv_canary.config import RealDataMode
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.perturb.injector import FaultInjector
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.perturb.live_rows import LiveRow, live_rows
from sglang.srt.kv_canary.perturb.real_kv_used import RealKvUsedPerturbation
from sglang.srt.kv_canary.perturb.req_to_token import ReqToTokenPerturbation, distinct_positions
from sglang.srt.kv_canary.pools.mha import MHACanaryPool
from sglang.srt.kv_canary.pools.real_data import PARTIAL_BYTES_PER_SOURCE, real_data_sources
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedRequest, SimulatedServer
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")


class _Capture:
    """Keeps the batches a SimulatedServer forwards and runs its model (no canary involved)."""

    def __init__(self) -> None:
        self.batches: list[ForwardBatch] = []
        self.server = SimulatedServer(page_size=4, num_pages=32, max_requests=8,
                                      max_context_len=64, forward=self._forward)

    def _forward(self, batch: ForwardBatch) -> None:
        self.batches.append(batch)
        self.server.runner.forward(batch)


def _decoding_server(prompt_lens: list[int]) -> tuple[SimulatedServer, ForwardBatch]:
    """Requests prefilled, then the next decode batch (captured, not yet run)."""
    capture = _Capture()
    server = capture.server
    requests = [SimulatedRequest(rid=f"r{i}", prompt=list(range(7, 7 + n)), max_new_tokens=9)
                for i, n in enumerate(prompt_lens)]
    for request in requests:
        server.admit(request)
    server.extend([(r, len(r.prompt)) for r in requests])
    server.decode(requests)
    return server, capture.batches[-1]


def test_live_rows_come_from_the_cpu_lengths() -> None:
    server, decode = _decoding_server([3, 6])
    assert [(r.row, r.prefix_len, r.rid) for r in live_rows(decode)] == [(0, 3, "r0"), (1, 6, "r1")]
    extend = ForwardBatch(
        forward_mode=ForwardMode.MIXED, batch_size=2, input_ids=torch.zeros(3),
        req_pool_indices=torch.tensor([1, 2]), seq_lens=torch.tensor([2, 5]),
        out_cache_loc=torch.zeros(3), seq_lens_sum=7, extend_prefix_lens_cpu=[0, 4],
    )
    assert [r.prefix_len for r in live_rows(extend)] == [0, 4]
    decode.seq_lens_cpu = None
    with pytest.raises(ValueError, match="seq_lens_cpu"):
        live_rows(decode)


def test_distinct_positions_cover_exactly_the_valid_pairs() -> None:
    rng = random.Random(0)
    for target_len in range(1, 5):
        for source_len in range(1, 5):
            if target_len == source_len == 1:
                continue
            valid = {(t, s) for t in range(target_len) for s in range(source_len) if t != s}
            seen = {distinct_positions(rng=rng, target_len=target_len, source_len=source_len)
                    for _ in range(400)}
            assert seen == valid, (target_len, source_len)


def test_req_to_token_points_one_prefix_entry_at_another_requests_prefix_slot() -> None:
    server, batch = _decoding_server([5, 9, 2])
    table = server.req_to_token_pool.req_to_token
    before = table.clone()
    perturbation = ReqToTokenPerturbation(req_to_token=table)
    for seed in range(30):
        fault = perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                                    rng=random.Random(seed), step=0)
        changed = (table != before).nonzero().tolist()
        assert len(changed) == 1
        (req_pool_idx, position), = changed
        target_row = batch.req_pool_indices.tolist().index(req_pool_idx)
        assert (fault.row.row, fault.position) == (target_row, position)
        assert position < fault.row.prefix_len
        new_slot = int(table[req_pool_idx, position])
        assert new_slot not in batch.out_cache_loc.tolist()
        source_rows = [r for r in range(3) if r != target_row]
        assert any(
            new_slot in before[batch.req_pool_indices[r], : int(batch.seq_lens_cpu[r]) - 1].tolist()
            for r in source_rows
        )
        assert new_slot not in before[req_pool_idx, : fault.row.prefix_len].tolist()
        fault.undo()
        assert torch.equal(table, before)


def test_req_to_token_needs_two_rows_with_a_prefix() -> None:
    server, batch = _decoding_server([5])
    perturbation = ReqToTokenPerturbation(req_to_token=server.req_to_token_pool.req_to_token)
    assert perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                               rng=random.Random(0), step=0) is None
    rows = [LiveRow(row=0, prefix_len=1, rid="a"), LiveRow(row=1, prefix_len=1, rid="b")]
    assert perturbation.inject(forward_batch=batch, rows=rows, rng=random.Random(0), step=0) is None


def _fingerprinted_bytes(server: SimulatedServer) -> dict[str, torch.Tensor]:
    """Byte views of K and V of the first and the last layer (what the fingerprint reads)."""
    pool = server.kv_pool
    views = {}
    for layer in sorted({0, pool.layer_num - 1}):
        for name, buffers in (("K", pool.k_buffer), ("V", pool.v_buffer)):
            buffer = buffers[layer]
            views[f"layer_{layer}_{name}"] = buffer.view(buffer.shape[0], -1).view(torch.uint8)
    return views


def test_real_kv_used_flips_one_fingerprinted_byte_of_a_live_prefix_slot() -> None:
    """One byte of K or V of the first or last layer, at the slot's rotating 16-byte window
    (the one ``real_data=partial`` reads), XOR 0xFF; nothing else; undone exactly. (It used to
    flip byte 0 of layer 0's K.)"""
    server, batch = _decoding_server([4, 6])
    views = _fingerprinted_bytes(server)
    before = {name: view.clone() for name, view in views.items()}
    perturbation = RealKvUsedPerturbation(
        req_to_token=server.req_to_token_pool.req_to_token,
        kv_bytes=FingerprintedBytes(pool=MHACanaryPool(server.kv_pool)),
    )
    buffers_hit = set()
    for seed in range(16):
        fault = perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                                    rng=random.Random(seed), step=0)
        assert fault.position < fault.row.prefix_len
        slot = int(server.req_to_token_pool.req_to_token[
            batch.req_pool_indices[fault.row.row], fault.position])
        assert slot not in batch.out_cache_loc.tolist()
        changed = {
            name: (view != before[name]).nonzero().tolist() for name, view in views.items()
        }
        changed = {name: where for name, where in changed.items() if where}
        assert list(changed) == [fault.detail.removeprefix("buffer=")]
        (name, [[row, byte]]), = changed.items()
        windows = views[name].shape[1] // PARTIAL_BYTES_PER_SOURCE
        assert (row, byte) == (slot, (slot % windows) * PARTIAL_BYTES_PER_SOURCE)
        assert int(views[name][slot, byte]) == int(before[name][slot, byte]) ^ 0xFF
        buffers_hit.add(name)
        fault.undo()
        assert all(torch.equal(views[n], before[n]) for n in views)
    assert buffers_hit == set(views)  # K and V of both fingerprinted layers get chosen


@pytest.mark.parametrize("stride", [1, 2])
def test_with_partial_real_data_the_flip_lands_in_the_row_the_verify_reads(stride) -> None:
    """``partial`` reads one fingerprinted row per due position and forward: the flip goes into
    that row (when the position is due in the step), so the forward reports it."""
    server, batch = _decoding_server([4, 6])
    views = _fingerprinted_bytes(server)
    names = list(views)  # K and V of the first layer, then of the last: the sources' order
    before = {name: view.clone() for name, view in views.items()}
    real = real_data_sources(pool=MHACanaryPool(server.kv_pool), real_data=RealDataMode.PARTIAL,
                             verify_stride=stride)
    perturbation = RealKvUsedPerturbation(
        req_to_token=server.req_to_token_pool.req_to_token,
        kv_bytes=FingerprintedBytes(pool=MHACanaryPool(server.kv_pool), real_data=real),
    )
    due_flips = 0
    for seed in range(24):
        step = 10 + seed
        fault = perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                                    rng=random.Random(seed), step=step)
        name = fault.detail.removeprefix("buffer=")
        due = due_source_scalar(position=fault.position, step=step, stride=stride,
                                num_sources=len(names))
        if due is not None:
            assert name == names[due]
            due_flips += 1
        fault.undo()
        assert all(torch.equal(views[n], before[n]) for n in views)
    assert due_flips > 0


def _injector(*, warmup: int, seed: int, prob: float, server: SimulatedServer) -> FaultInjector:
    return FaultInjector(
        warmup_steps=warmup, seed=seed,
        before_forward=[(prob, ReqToTokenPerturbation(
            req_to_token=server.req_to_token_pool.req_to_token))],
    )


def test_injector_waits_for_the_warmup_and_logs_each_fault(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    server, batch = _decoding_server([5, 9])
    injector = _injector(warmup=3, seed=0, prob=1.0, server=server)
    assert [injector.before_forward(forward_batch=batch, step=s) for s in range(3)] == [[], [], []]
    faults = injector.before_forward(forward_batch=batch, step=3)
    assert len(faults) == 1
    match = PERTURB_LINE_RE.search(caplog.messages[-1])
    assert match is not None and match["step"] == "3" and match["fault"] == "req_to_token"
    assert int(match["position"]) == faults[0].position
    faults[0].undo()


def test_injector_is_reproducible_and_respects_the_probability() -> None:
    server, batch = _decoding_server([5, 9, 7])

    def choices(seed: int, prob: float) -> list[tuple[int, int] | None]:
        injector = _injector(warmup=0, seed=seed, prob=prob, server=server)
        result = []
        for step in range(40):
            faults = injector.before_forward(forward_batch=batch, step=step)
            result.append((faults[0].row.row, faults[0].position) if faults else None)
            for fault in faults:
                fault.undo()
        return result

    assert choices(5, 0.5) == choices(5, 0.5)
    assert choices(5, 0.5) != choices(6, 0.5)
    assert 5 < sum(c is not None for c in choices(5, 0.5)) < 35
    assert all(c is None for c in choices(5, 0.0))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
