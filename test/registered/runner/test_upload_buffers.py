"""The upload buffer ring: slices of preallocated host buffers in turn, a buffer reused only
after its copy completed (else an upload gets a buffer of its own, nothing waits), and a buffer
handed out again before its own copy refused loudly."""

import sys

import pytest
import torch

from sglang.srt.kv_canary.runner.request_rows import RequestRows
from sglang.srt.kv_canary.runner.upload_buffers import UploadBufferRing
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")
register_cuda_ci(est_time=2, suite="kv-canary-gpu")


class _Event:
    """A device event the test completes by hand."""

    def __init__(self) -> None:
        self.recorded = 0
        self.done = True

    def record(self) -> None:
        self.recorded += 1
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def _ring(slots: int = 2, words: int = 8):
    events: list[_Event] = []

    def new_event() -> _Event:
        events.append(_Event())
        return events[-1]

    return UploadBufferRing(slots=slots, words=words, pin_memory=False,
                            new_event=new_event), events


def test_buffers_are_handed_out_in_turn_and_reused_once_their_copy_completed() -> None:
    ring, events = _ring()
    first = ring.take(5)
    assert first.slot == 0 and first.tensor.shape == (5,)
    first.tensor[:] = torch.arange(5)
    device = torch.zeros(5, dtype=torch.int64)
    ring.copy(first, to=device)
    assert device.tolist() == [0, 1, 2, 3, 4] and events[0].recorded == 1
    second = ring.take(8)
    assert second.slot == 1
    ring.copy(second, to=torch.zeros(8, dtype=torch.int64))
    # slot 0's copy has not completed: this upload gets a buffer of its own
    own = ring.take(3)
    assert own.slot is None and own.tensor.shape == (3,)
    assert own.tensor.data_ptr() not in {b.data_ptr() for b in ring._buffers}
    events[0].done = True
    again = ring.take(4)
    assert again.slot == 0 and again.tensor.data_ptr() == first.tensor.data_ptr()
    assert again.generation == first.generation + 1


def test_a_buffer_never_copied_is_reused_and_an_oversized_upload_gets_its_own() -> None:
    ring, _ = _ring()
    assert [ring.take(2).slot for _ in range(5)] == [0, 1, 0, 1, 0]
    assert ring.take(9).slot is None


def test_a_buffer_handed_out_again_before_its_copy_is_refused() -> None:
    ring, _ = _ring()
    stale = ring.take(2)
    ring.take(2)
    ring.take(2)  # slot 0 again: `stale`'s contents are this upload's now
    with pytest.raises(RuntimeError, match="handed out again before its upload"):
        ring.copy(stale, to=torch.zeros(2, dtype=torch.int64))


def test_views_of_a_ring_slice_are_made_once_per_slot_and_size() -> None:
    ring, events = _ring(slots=2, words=8)
    first = ring.take(6)
    assert ring.take(6).slot == 1
    again = ring.take(6)
    assert again.slot == 0 and again.generation == first.generation + 1
    assert again.tensor is first.tensor and again.array is first.array  # made once
    view = ring.view(first, start=2, words=3)
    assert ring.view(again, start=2, words=3) is view
    assert view.data_ptr() == first.tensor.data_ptr() + 2 * 8 and view.shape == (3,)
    again.array[:] = range(6)
    assert view.tolist() == [2, 3, 4]
    assert ring.view(again, start=1, words=3).tolist() == [1, 2, 3]  # another size: its own
    own = ring.take(9)  # larger than a buffer: one of its own, sliced each time
    own.array[:] = range(9)
    assert own.slot is None and ring.view(own, start=4, words=2).tolist() == [4, 5]


def test_request_rows_pack_into_the_ring() -> None:
    ring, _ = _ring(words=64)

    class Req:
        rid, origin_input_ids, output_ids, req_pool_idx, retraction_count = "a", [1, 2], [3], 1, 0

    rows = RequestRows(num_rows=4, token_history=True, owner_chains=True, pin_memory=False,
                       upload_buffers=ring)
    updates = rows.prepare(reqs=[Req()], prefix_lens=[2], seq_lens=[3])
    assert updates.upload_buffer.slot == 0
    assert updates.packed.data_ptr() == ring._buffers[0].data_ptr()
    assert updates.token_history.req_all_ids_flat.tolist() == [1, 2, 3]


@pytest.mark.gpu
def test_pinned_ring_buffers_wait_for_their_copy_on_the_device() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from sglang.srt.kv_canary.monitor.counter_snapshots import event_factory_for

    device = torch.device("cuda")
    ring = UploadBufferRing(slots=1, words=16, pin_memory=True,
                            new_event=event_factory_for(device))
    target = torch.zeros(16, dtype=torch.int64, device=device)
    buffer = ring.take(16)
    assert buffer.tensor.is_pinned()
    buffer.tensor[:] = 7
    torch.cuda._sleep(1000)  # warm-up: a kernel's first launch loads its module and waits
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s: the copy waits behind it
    ring.copy(buffer, to=target)
    assert ring.take(16).slot is None  # still in flight: a buffer of its own
    torch.cuda.synchronize()
    assert target.tolist() == [7] * 16 and ring.take(16).slot == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
