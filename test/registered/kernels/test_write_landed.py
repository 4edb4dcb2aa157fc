"""Real data on, every K/V write of a forward must land in its slot.

The pre launch writes a landing poison (128 bits per source, different per slot, source and
forward) into the landing window of every slot the forward is to write; the post launch reports
``VERIFY_NOT_LANDED`` for a new slot whose window still holds it in some source. A write that
went to another slot, or a source the model did not write, is caught at its step; a slot the
model rewrites with the very bytes it held before is not (the poison, not the old bytes, is
what must be gone).

Run on the torch reference and the Triton kernels; expectations come from the scalar spec.
"""

import dataclasses
import sys

import pytest
import torch

from _canary_sim import IMPLS, KvSim, Violation, canary_impl, chain_at, prefilled
from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.jit_kernel.kv_canary.hashing import (
    landing_columns,
    landing_poison_scalar,
    to_signed_i64,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")
register_cuda_ci(est_time=30, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

POST = CheckKind.POST_VERIFY
TOKENS_A = [11, 12, 13, 14, 15, 16, 17, 18, 19]
TOKENS_B = [21, 22, 23, 24, 25, 26, 27, 28, 29]


def _not_landed(sim: KvSim, *, rp: int, slot: int, position: int, step: int) -> Violation:
    record = sim.record(slot)
    tokens = sim.requests[rp].tokens
    return Violation(POST, Reason.VERIFY_NOT_LANDED, rp, slot, position, record.token, -1,
                     chain_at(tokens, position), chain_at(tokens, position), step)


def _run(sim: KvSim, launches, batch, *, model) -> None:
    """One forward whose model step is ``model(batch)`` instead of the sim's own write."""
    launches.launch_pre_forward(state=sim.state, batch=batch)
    model(batch)
    launches.launch_post_forward(state=sim.state, batch=batch)
    sim.assert_guards_intact()


@pytest.mark.parametrize("real_data", ["partial", "all"])
def test_a_write_that_landed_in_another_slot_is_caught(impl, device, real_data):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 5), (TOKENS_B, 5)],
                              real_data=real_data)
    batch = sim.decode_batch([1, 2])
    intended = int(batch.out_cache_loc[0])
    stray = sim.free_pages[0] * sim.page_size  # a free slot: nothing else notices
    moved = batch.out_cache_loc.clone()
    moved[0] = stray
    _run(sim, launches, batch,
         model=lambda b: sim.model_writes_kv(dataclasses.replace(b, out_cache_loc=moved)))
    assert sim.violations() == [_not_landed(sim, rp=1, slot=intended, position=5, step=1)]
    sim.consume()
    sim.forward(launches, sim.decode_batch([1, 2]))  # the next step is clean
    assert sim.violations() == []


@pytest.mark.parametrize("missing", [0, 1, 2, 3])
def test_each_source_the_model_did_not_write_is_caught(impl, device, missing):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 5)], real_data="partial",
                              num_sources=4)
    batch = sim.decode_batch([1])
    slot = int(batch.out_cache_loc[0])
    skipped = sim.kv_buffers[missing]
    pre_image = {}

    def model(b):
        kept = skipped.clone()  # after the pre launch: the poison is in place
        pre_image["words"] = sim.sources[missing][slot].clone()
        sim.model_writes_kv(b)
        skipped.copy_(kept)  # this source's write never happened (its window keeps the poison)

    _run(sim, launches, batch, model=model)
    assert sim.violations() == [_not_landed(sim, rp=1, slot=slot, position=5, step=1)]
    # the window the pre launch wrote holds the scalar spec's poison
    words = pre_image["words"].tolist()
    source = sim.sources[missing]
    for column in landing_columns(slot=slot, words_per_row=source.shape[1],
                                  num_rows=source.shape[0]):
        assert words[column] == to_signed_i64(
            landing_poison_scalar(slot=slot, step=1, source=missing, column=column))


def test_a_rewrite_with_the_bytes_the_slot_held_is_not_reported(impl, device):
    """The model writes into a slot exactly the bytes it held before the forward (a slot freed
    and reused for the same K/V, say): the poison is gone, so the write landed."""
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 5)], real_data="all")
    batch = sim.decode_batch([1])
    slot = int(batch.out_cache_loc[0])
    held = [buffer[slot].clone() for buffer in sim.kv_buffers]

    def model(_):
        for buffer, values in zip(sim.kv_buffers, held):
            buffer[slot] = values

    _run(sim, launches, batch, model=model)
    assert sim.violations() == []


def test_one_unwritten_token_of_a_prefill_chunk_is_caught(impl, device):
    sim = KvSim(device=device, real_data="partial")
    launches = canary_impl(impl)
    sim.add_request(1, TOKENS_A)
    batch = sim.extend_batch([(1, 6)])
    lost = int(batch.out_cache_loc[3])
    written = batch.out_cache_loc.clone()
    written[3] = 0  # the model's write of position 3 went nowhere
    _run(sim, launches, batch,
         model=lambda b: sim.model_writes_kv(dataclasses.replace(b, out_cache_loc=written)))
    assert sim.violations() == [_not_landed(sim, rp=1, slot=lost, position=3, step=0)]


def test_real_data_off_leaves_the_kv_bytes_alone(impl, device):
    sim, launches = prefilled(impl, device, prompts=[(TOKENS_A, 5)])
    batch = sim.decode_batch([1])
    before = [buffer.clone() for buffer in sim.kv_buffers]
    launches.launch_pre_forward(state=sim.state, batch=batch)
    assert all(torch.equal(a, b) for a, b in zip(before, sim.kv_buffers))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
