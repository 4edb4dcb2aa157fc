"""The perturbations added with ownership, the seq_lens mirror and the sweep, on real SGLang
pools: ``seq_lens`` (device value drifts from the host mirror, one forward), ``foreign_prefix``
(a whole prefix pointed at another request's, skipped for a shared history) and
``real_kv_post_forward`` (a byte of a slot this forward wrote, kept); and the injector's
after-forward point and configuration. (``real_kv_unused_cache`` is tested over a real
RadixCache in test/registered/runner/test_radix_sweep.py.)"""

import logging
import random
import sys

import torch

from sglang.jit_kernel.kv_canary.consts import FIELD_STAMP
from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.perturb.foreign_prefix import ForeignPrefixPerturbation
from sglang.srt.kv_canary.perturb.injector import build_fault_injector
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.pools.mha import MHACanaryPool
from sglang.srt.kv_canary.perturb.live_rows import live_rows
from sglang.srt.kv_canary.perturb.real_kv_post_forward import RealKvPostForwardPerturbation
from sglang.srt.kv_canary.perturb.seq_lens import SeqLensPerturbation
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedRequest, SimulatedServer
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")


def _server_and_batches(
    prompts: list[list[int]], *, decode: bool = True
) -> tuple[SimulatedServer, list[ForwardBatch]]:
    """Requests admitted and prefilled (one EXTEND), then one DECODE (when ``decode``)."""
    batches: list[ForwardBatch] = []

    def forward(batch: ForwardBatch) -> None:
        batches.append(batch)
        server.runner.forward(batch)

    server = SimulatedServer(page_size=1, num_pages=64, max_requests=8, max_context_len=32,
                             forward=forward)
    requests = [SimulatedRequest(rid=f"r{i}", prompt=list(p), max_new_tokens=9)
                for i, p in enumerate(prompts)]
    for request in requests:
        server.admit(request)
    server.extend([(r, len(r.prompt)) for r in requests])
    if decode:
        server.decode(requests)
    return server, batches


def _kv_bytes(server: SimulatedServer) -> list[torch.Tensor]:
    pool = server.kv_pool
    return [
        buffers[layer].view(buffers[layer].shape[0], -1).view(torch.uint8)
        for layer in sorted({0, pool.layer_num - 1})
        for buffers in (pool.k_buffer, pool.v_buffer)
    ]


def test_seq_lens_adds_one_to_a_device_row_and_leaves_the_host_mirror() -> None:
    _, batches = _server_and_batches([[5, 6, 7], [8, 9, 10, 11]])
    batch = batches[-1]
    shared = batch.seq_lens  # the scheduler's batch holds this very tensor
    device, host = shared.clone(), batch.seq_lens_cpu.clone()
    fault = SeqLensPerturbation().inject(forward_batch=batch, rows=live_rows(batch),
                                         rng=random.Random(3), step=0)
    delta = (batch.seq_lens - device).tolist()
    assert sorted(delta) == [0, 1] and delta[fault.row.row] == 1
    assert torch.equal(batch.seq_lens_cpu, host)
    # the forward reads a drifted copy; the shared tensor SGLang plans allocations with is not
    # touched (an in-place drift leaked a page under the overlap scheduler)
    assert torch.equal(shared, device) and batch.seq_lens is not shared
    assert fault.position == int(host[fault.row.row]) + 1  # the drifted device value
    fault.undo()
    assert batch.seq_lens is shared and torch.equal(shared, device)


def _records_of(server: SimulatedServer) -> torch.Tensor:
    """Records as distinct as their slots (any two histories differ)."""
    slots = server.kv_pool.k_buffer[0].shape[0]
    records = torch.zeros((slots, 4), dtype=torch.int64)
    records[:, :FIELD_STAMP] = torch.arange(slots)[:, None] + 1
    return records


def test_foreign_prefix_points_the_whole_prefix_at_another_rows_prefix() -> None:
    server, batches = _server_and_batches([[1, 2, 3, 4, 5], [6, 7, 8]])
    batch = batches[-1]
    table = server.req_to_token_pool.req_to_token
    before = table.clone()
    perturbation = ForeignPrefixPerturbation(req_to_token=table, records=_records_of(server))
    fault = perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                                rng=random.Random(0), step=0)
    # only the shorter row can take the other's prefix of its own length: r1 (prefix 3) reads
    # r0's positions 0..2
    source, target = (int(rp) for rp in batch.req_pool_indices)
    assert (fault.row.row, fault.position) == (1, 2)
    assert "source_row=0" in fault.detail and "length=3" in fault.detail
    assert torch.equal(table[target, :3], before[source, :3])
    assert torch.equal(table[target, 3:], before[target, 3:])
    assert torch.equal(table[source], before[source])
    fault.undo()
    assert torch.equal(table, before)


def test_foreign_prefix_skips_rows_sharing_their_history() -> None:
    server, batches = _server_and_batches([[1, 2, 3, 4], [6, 7, 8, 9]])
    batch = batches[-1]
    table = server.req_to_token_pool.req_to_token
    records = _records_of(server)
    rps = [int(rp) for rp in batch.req_pool_indices]
    # the last prefix records of both rows hold the same (token, position, chain): one history
    records[int(table[rps[1], 3])] = records[int(table[rps[0], 3])]
    before = table.clone()
    perturbation = ForeignPrefixPerturbation(req_to_token=table, records=records)
    for seed in range(8):
        assert perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                                   rng=random.Random(seed), step=0) is None
    assert torch.equal(table, before)


def test_real_kv_post_forward_flips_a_slot_this_forward_wrote_and_keeps_it() -> None:
    server, batches = _server_and_batches([[1, 2, 3, 4, 5], [6, 7, 8]], decode=False)
    batch = batches[-1]  # the EXTEND that wrote both prompts
    views = _kv_bytes(server)
    before = [view.clone() for view in views]
    perturbation = RealKvPostForwardPerturbation(kv_bytes=FingerprintedBytes(pool=MHACanaryPool(server.kv_pool)))
    fault = perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                                rng=random.Random(4), step=0)
    token_index = int(dict(p.split("=") for p in fault.detail.split())["token_index"])
    slot = int(batch.out_cache_loc[token_index])
    changed = [(view != old).nonzero().tolist() for view, old in zip(views, before)]
    assert sorted(len(c) for c in changed) == [0, 0, 0, 1]
    [[row, _]] = next(c for c in changed if c)
    assert row == slot
    assert fault.position == token_index - [0, 5][fault.row.row]  # prefix 0, rows at 0 and 5
    assert "persistent=1" in fault.detail
    fault.undo()  # nothing to undo: the corruption stays, as a stray write would
    assert [(view != old).sum().item() for view, old in zip(views, before)].count(1) == 1


def test_the_injector_runs_after_forward_perturbations_only_after_the_forward(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    server, batches = _server_and_batches([[1, 2, 3, 4, 5], [6, 7, 8]])
    batch = batches[-1]
    state = CanaryDeviceState.zeros(
        num_slots=server.kv_pool.k_buffer[0].shape[0],
        req_to_token=server.req_to_token_pool.req_to_token, ring_capacity=4,
    )
    injector = build_fault_injector(
        config=PerturbConfig(warmup_steps=1, seed=2, real_kv_post_forward_prob=1.0),
        state=state, pool=MHACanaryPool(server.kv_pool), vocab_size=1000,
    )
    views = _kv_bytes(server)
    before = [view.clone() for view in views]
    assert injector.before_forward(forward_batch=batch, step=5) == []
    assert injector.after_forward(forward_batch=batch, step=0) == []  # warm-up
    assert all(torch.equal(v, b) for v, b in zip(views, before))
    (fault,) = injector.after_forward(forward_batch=batch, step=1)
    assert fault.fault == "real_kv_post_forward"
    match = PERTURB_LINE_RE.search(caplog.messages[-1])
    assert match is not None and match["fault"] == "real_kv_post_forward" and match["step"] == "1"
    assert sum(int((v != b).sum()) for v, b in zip(views, before)) == 1


def test_no_enabled_perturbation_builds_no_injector() -> None:
    assert build_fault_injector(config=PerturbConfig(), state=None, pool=None,
                                vocab_size=10) is None


if __name__ == "__main__":
    import pytest

    sys.exit(pytest.main([__file__, "-v"]))
