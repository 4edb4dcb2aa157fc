"""The upload buffer ring: slices of preallocated host buffers in turn, a buffer reused only
after its copy completed, as the next counter publication's arrival on the host shows (else an
upload gets a buffer of its own, nothing waits), none handed out before serving starts, and a
buffer handed out again before its own copy refused loudly."""

import sys

import pytest
import torch

from sglang.srt.kv_canary.runner.request_rows import RequestRows
from sglang.srt.kv_canary.runner.upload_buffers import UploadBufferRing
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")
register_cuda_ci(est_time=2, suite="kv-canary-gpu")


class _Publications:
    """The newest counter publication that landed on the host, moved by hand."""

    def __init__(self) -> None:
        self.landed = 0

    def __call__(self) -> int:
        return self.landed


def _ring(slots: int = 2, words: int = 8):
    publications = _Publications()
    ring = UploadBufferRing(slots=slots, words=words, pin_memory=False)
    ring.open(landed=publications)
    return ring, publications


def test_buffers_are_handed_out_in_turn_and_reused_once_the_next_publication_landed() -> None:
    ring, publications = _ring()
    first = ring.take(5)
    assert first.slot == 0 and first.tensor.shape == (5,)
    first.tensor[:] = torch.arange(5)
    device = torch.zeros(5, dtype=torch.int64)
    ring.copy(first, to=device, mark=1)  # publication 1 follows this copy
    assert device.tolist() == [0, 1, 2, 3, 4]
    second = ring.take(8)
    assert second.slot == 1
    ring.copy(second, to=torch.zeros(8, dtype=torch.int64), mark=2)
    # publication 1 has not landed: slot 0's copy may not have completed, so this upload gets
    # a buffer of its own
    own = ring.take(3)
    assert own.slot is None and own.tensor.shape == (3,)
    assert own.tensor.data_ptr() not in {b.data_ptr() for b in ring._buffers}
    publications.landed = 1
    again = ring.take(4)
    assert again.slot == 0 and again.tensor.data_ptr() == first.tensor.data_ptr()
    assert again.generation == first.generation + 1
    assert ring.take(4).slot is None  # slot 1 waits for publication 2
    publications.landed = 5  # a later publication implies every earlier one
    assert ring.take(4).slot == 1


def test_a_ring_not_yet_open_hands_out_buffers_of_their_own() -> None:
    """Before serving starts, the host's and the device's publication numbers may disagree
    (warm-up, graph capture): no ring buffer is handed out until open()."""
    ring = UploadBufferRing(slots=2, words=8, pin_memory=False)
    assert ring.take(4).slot is None
    ring.open(landed=lambda: 1 << 62)
    assert ring.take(4).slot == 0


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
        ring.copy(stale, to=torch.zeros(2, dtype=torch.int64), mark=1)


def test_views_of_a_ring_slice_are_made_once_per_slot_and_size() -> None:
    ring, _ = _ring(slots=2, words=8)
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
    assert updates.host_sections.history.req_all_ids_flat.tolist() == [1, 2, 3]


@pytest.mark.gpu
def test_pinned_ring_buffers_wait_for_the_publication_after_their_copy() -> None:
    """On a GPU: a ring slot whose copy is queued behind a long kernel is not handed out until
    the counter publication enqueued after it reaches the host copy."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from sglang.jit_kernel.kv_canary import publish_counters
    from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS
    from sglang.srt.kv_canary.monitor.counter_mailbox import CounterMailbox

    device = torch.device("cuda")
    mailbox = CounterMailbox(
        counters=torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=device),
        seal=publish_counters.launch_publish_counters,
    )
    ring = UploadBufferRing(slots=1, words=16, pin_memory=True)
    ring.open(landed=mailbox.peek_publications)
    target = torch.zeros(16, dtype=torch.int64, device=device)
    buffer = ring.take(16)
    assert buffer.tensor.is_pinned()
    buffer.tensor[:] = 7
    mailbox.publish()  # warm-up: the seal kernel's first launch loads its module and waits
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    assert mailbox.peek_publications() == 1
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s: the copy and the publication wait behind it
    ring.copy(buffer, to=target, mark=2)
    mailbox.publish()
    assert ring.take(16).slot is None  # still in flight: a buffer of its own
    torch.cuda.synchronize()
    assert mailbox.peek_publications() == 2
    assert target.tolist() == [7] * 16 and ring.take(16).slot == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
