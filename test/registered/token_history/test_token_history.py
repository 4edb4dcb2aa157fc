"""Request-row bookkeeping and the device token history on CPU (Triton kernels interpreted).

:class:`RequestRows` packs what one forward uploads (new owners only, or, for EAGLE, every row's
new tokens) and :class:`TokenHistory` scatters it and appends the sampled tokens; over a schedule
with arrivals, chunked prefill, decode, finishing, retraction and row reuse, the device must hold
exactly each running request's history at every step, while the host sends each token at most
once (device appends: only whole histories of new owners).
"""

import dataclasses
import sys

import pytest
import torch
from _triton_mode import interpret_kernels_without_cuda

interpret_kernels_without_cuda()

from _history_schedule import FakeReq, SimulatedSchedule, SyncedHistory  # noqa: E402

from sglang.jit_kernel.kv_canary import append_history, append_history_ref  # noqa: E402
from sglang.jit_kernel.kv_canary.hashing import chain_after_scalar  # noqa: E402
from sglang.jit_kernel.kv_canary.scatter_req_token_ids import launch_scatter_req_token_ids_kernel  # noqa: E402
from sglang.jit_kernel.kv_canary.scatter_req_token_ids_ref import (  # noqa: E402
    scatter_req_token_ids_torch_reference,
)
from sglang.srt.kv_canary.runner.request_rows import (  # noqa: E402
    UNKNOWN_OWNER_CHAIN,
    RequestRows,
    RowUpdates,
)
from sglang.srt.kv_canary.runner.upload_buffers import UploadBufferRing  # noqa: E402
from sglang.srt.kv_canary.token_history.history import TokenHistory  # noqa: E402
from sglang.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=45, suite="kv-canary-cpu")

_DEVICE = "cpu"
_REF = dict(scatter=scatter_req_token_ids_torch_reference,
            bind_append=append_history_ref.bind_append_history_tokens)
_TRITON = dict(scatter=launch_scatter_req_token_ids_kernel,
               bind_append=append_history.bind_append_history_tokens)


@pytest.fixture(autouse=True)
def _cpu_only() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU variant; test_token_history_gpu.py covers CUDA")


def _req(rid: str, prompt: list[int], outputs: list[int], row: int) -> FakeReq:
    req = FakeReq(rid, prompt)
    req.output_ids = outputs
    req.req_pool_idx = row
    return req


def _rows(**kwargs) -> RequestRows:
    return RequestRows(num_rows=6, pin_memory=False, **{"token_history": True,
                                                         "owner_chains": True} | kwargs)


def _flat(updates: RowUpdates) -> list[int]:
    return updates.host_sections.history.req_all_ids_flat.tolist()


def test_a_new_owner_s_upload_layout() -> None:
    reqs = [_req("a", [1, 2, 3], [4], row=3), _req("b", [], [], row=1), _req("c", [9], [8], row=2)]
    rows = _rows(owner_chains=False)
    updates = rows.prepare(reqs=reqs, prefix_lens=[0, 0, 0], seq_lens=[4, 1, 2])
    history = updates.host_sections.history
    assert history.req_pool_indices.tolist() == [3, 1, 2]
    assert history.req_all_ids_lens.tolist() == [4, 0, 2]
    assert history.offsets.tolist() == [0, 4, 4, 6]
    assert history.req_all_ids_flat.tolist() == [1, 2, 3, 4, 9, 8]
    assert updates.packed.dtype == torch.int64 and updates.packed.device.type == "cpu"
    # one buffer (one host-to-device copy): rows, lengths, offsets, tokens
    assert updates.packed.shape == (3 * 3 + 1 + 6,)
    sections = updates.sections_on(updates.packed.clone())
    assert sections.history.req_all_ids_flat.tolist() == [1, 2, 3, 4, 9, 8]
    assert sections.owners is None and sections.admissions is None
    assert updates.commit_rows == (3, 1, 2) and updates.commit_history_lens == (4, 0, 2)
    flat, lens = updates.history_tokens_and_lens()  # the carrier's public views
    assert flat.tolist() == [1, 2, 3, 4, 9, 8] and lens.tolist() == [4, 0, 2]


def test_a_known_row_sends_nothing_the_device_appends_its_tokens() -> None:
    rows = _rows()
    a, b = _req("a", [1, 2, 3], [], row=3), _req("b", [5], [6], row=1)
    rows.commit(rows.prepare(reqs=[a, b], prefix_lens=[0, 0], seq_lens=[3, 2]))
    a.output_ids.append(7)
    b.output_ids.append(8)
    step = rows.prepare(reqs=[a, b], prefix_lens=[3, 2], seq_lens=[4, 3])
    assert step.empty and step.history_tokens_and_lens() is None
    assert step.commit_rows == () and step.deferred == ()


def test_history_tails_send_each_row_s_new_tokens_once() -> None:
    """EAGLE (``history_tails``): the host sends what the device lacks; a history that shrank in
    place is rewritten from position 0."""
    rows = _rows(history_tails=True)
    a, b = _req("a", [1, 2, 3], [4], row=3), _req("b", [5], [], row=1)
    first = rows.prepare(reqs=[a, b], prefix_lens=[0, 0], seq_lens=[4, 1])
    again = rows.prepare(reqs=[a, b], prefix_lens=[0, 0], seq_lens=[4, 1])
    assert _flat(first) == _flat(again) == [1, 2, 3, 4, 5]  # not committed: nothing assumed
    rows.commit(first)
    assert rows.prepare(reqs=[a, b], prefix_lens=[4, 1], seq_lens=[4, 1]).empty
    a.output_ids += [6, 7, 8]  # an accepted block
    step = rows.prepare(reqs=[a, b], prefix_lens=[4, 1], seq_lens=[7, 1])
    history = step.host_sections.history
    assert history.req_pool_indices.tolist() == [3] and history.req_all_ids_lens.tolist() == [7]
    assert history.req_all_ids_flat.tolist() == [6, 7, 8]
    assert step.host_sections.owners.rows.tolist() == []
    rows.commit(step)
    del a.output_ids[:]  # the same list, shorter
    shrunk = rows.prepare(reqs=[a, b], prefix_lens=[3, 1], seq_lens=[3, 1])
    assert _flat(shrunk) == [1, 2, 3]


@pytest.mark.parametrize("token_history", [True, False], ids=["with-history", "chains-only"])
def test_new_owners_get_the_chain_of_their_own_tokens(token_history: bool) -> None:
    a, b = _req("a", [1, 2, 3], [4], row=3), _req("b", [7, 8], [], row=1)
    rows = _rows(token_history=token_history)
    first = rows.prepare(reqs=[a, b], prefix_lens=[4, 0], seq_lens=[5, 2])
    owners = first.host_sections.owners
    assert owners.rows.tolist() == [3, 1]
    assert owners.values.tolist() == [chain_after_scalar(tokens=[1, 2, 3, 4]),
                                      chain_after_scalar(tokens=[])]
    rows.commit(first)
    a.output_ids.append(5)
    c = _req("c", [9, 10, 11 + (1 << 40)], [], row=2)  # a token id above 32 bits
    second = rows.prepare(reqs=[a, c, b], prefix_lens=[5, 2, 2], seq_lens=[6, 3, 2])
    owners = second.host_sections.owners
    assert owners.rows.tolist() == [2]  # only the new owner
    assert owners.values.tolist() == [chain_after_scalar(tokens=[9, 10])]
    if token_history:  # c's whole history only
        assert _flat(second) == [9, 10, 11 + (1 << 40)]
        assert second.host_sections.history.offsets.tolist() == [0, 3]
    else:
        assert second.host_sections.history is None


@pytest.mark.parametrize("token_history", [True, False], ids=["with-history", "chains-only"])
def test_deferred_admissions_reset_the_row_first_and_send_its_tokens_later(
    token_history: bool,
) -> None:
    a, b = _req("a", [1, 2, 3], [4], row=3), _req("b", [7, 8, 9], [], row=1)
    rows = _rows(token_history=token_history)
    rows.commit(rows.prepare(reqs=[a], prefix_lens=[3], seq_lens=[4]))
    a.output_ids.append(5)
    early = rows.prepare(reqs=[a, b], prefix_lens=[4, 2], seq_lens=[5, 3],
                         defer_new_owners=True)
    # a continues as before; b's row is only reset: owner chain unknown, no known tokens
    sections = early.host_sections
    assert [d.row for d in early.deferred] == [1] and early.deferred[0].prefix_len == 2
    assert sections.owners.rows.tolist() == [1] and sections.owners.values.tolist() == [0]
    assert sections.admissions is None
    if token_history:
        assert sections.history.req_pool_indices.tolist() == [1]
        assert sections.history.req_all_ids_lens.tolist() == [0]
        assert sections.history.req_all_ids_flat.tolist() == []
    assert early.commit_rows == ()  # b's row keeps its previous owner until the late commit
    late = rows.prepare_deferred(early.deferred)
    sections = late.host_sections
    assert sections.owners is None
    assert sections.admissions.rows.tolist() == [1]
    assert sections.admissions.prefix_lens.tolist() == [2]
    assert sections.admissions.chains.tolist() == [chain_after_scalar(tokens=[7, 8])]
    if token_history:
        assert sections.history.req_all_ids_lens.tolist() == [3]
        assert sections.history.req_all_ids_flat.tolist() == [7, 8, 9]
    else:
        assert sections.history is None
    rows.commit(early)
    # the late part never uploaded: b is still a new owner, deferred again
    again = rows.prepare(reqs=[b], prefix_lens=[2], seq_lens=[3], defer_new_owners=True)
    assert [d.row for d in again.deferred] == [1]
    rows.commit(again)
    rows.commit(rows.prepare_deferred(again.deferred))
    b.output_ids.append(10)
    known = rows.prepare(reqs=[b], prefix_lens=[3], seq_lens=[4], defer_new_owners=True)
    assert known.deferred == () and known.empty


def test_deferred_admissions_are_read_once_and_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Token history on, every new owner is deferred, a fresh prompt's too: before the forward
    the device only forgets each row (known length 0, owner chain unknown). ``prepare_deferred``
    reads each request's tokens once, hands the whole histories over in ``read_whole`` (the
    write-input expectations take the prompt tokens from there) and checks the prefix chain only
    of a row with a cached prefix (a fresh row's seed is the anchor)."""
    from sglang.srt.kv_canary.runner import request_rows

    reads: list[int] = []
    real_read = request_rows._history_array

    def counting_read(origin, output, length, *, skip=0):
        reads.append(length)
        return real_read(origin, output, length, skip=skip)

    monkeypatch.setattr(request_rows, "_history_array", counting_read)
    fresh, cached, chunk = (_req("fresh", [1, 2, 3], [], row=1), _req("cached", [4, 5], [], row=2),
                            _req("chunk", [6, 7, 8, 9], [], row=3))
    rows = _rows()
    early = rows.prepare(reqs=[fresh, cached, chunk], prefix_lens=[0, 1, 0], seq_lens=[3, 2, 2],
                         defer_new_owners=True)
    assert reads == []
    assert [d.row for d in early.deferred] == [1, 2, 3]
    assert early.host_sections.history.req_all_ids_lens.tolist() == [0, 0, 0]
    assert early.host_sections.owners.values.tolist() == [UNKNOWN_OWNER_CHAIN] * 3
    assert early.commit_rows == () and early.read_whole == ()
    late = rows.prepare_deferred(early.deferred)
    assert reads == [3, 2, 4]
    assert _flat(late) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert [(row, tokens.tolist()) for row, tokens in late.read_whole] == [
        (1, [1, 2, 3]), (2, [4, 5]), (3, [6, 7, 8, 9])]
    admissions = late.host_sections.admissions
    assert admissions.rows.tolist() == [2]
    assert admissions.prefix_lens.tolist() == [1]
    assert admissions.chains.tolist() == [chain_after_scalar(tokens=[4])]
    owners_only = _rows(token_history=False)
    early = owners_only.prepare(reqs=[cached], prefix_lens=[1], seq_lens=[2],
                                defer_new_owners=True)
    assert owners_only.prepare_deferred(early.deferred).read_whole == ()


def test_without_a_token_history_no_fresh_row_is_deferred() -> None:
    """Owner chains only: a new owner without a cached prefix has nothing to read (its chain is
    the anchor), so it is never deferred, whatever it writes; one with a cached prefix is."""
    fresh, chunk, cached = (_req("fresh", [1, 2, 3], [], row=1), _req("chunk", [6, 7, 8, 9], [], row=3),
                            _req("cached", [4, 5], [], row=2))
    rows = _rows(token_history=False)
    early = rows.prepare(reqs=[fresh, chunk, cached], prefix_lens=[0, 0, 1], seq_lens=[3, 2, 2],
                         defer_new_owners=True)
    assert [d.row for d in early.deferred] == [2]
    assert early.host_sections.owners.rows.tolist() == [1, 3, 2]
    anchor = chain_after_scalar(tokens=[])
    assert early.host_sections.owners.values.tolist() == [anchor, anchor, 0]
    assert early.read_whole == ()


def test_a_fresh_row_s_chain_reads_nothing_of_its_request(monkeypatch) -> None:
    """Owner chains only, no cached prefix: the chain of no tokens, with no pass over the
    request's token lists (the batch-1 prefill's path to its first token)."""
    from sglang.srt.kv_canary.runner import request_rows

    def no_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("a fresh row's tokens were read")

    monkeypatch.setattr(request_rows, "_history_array", no_read)
    rows = RequestRows(num_rows=4, token_history=False, owner_chains=True, pin_memory=False)
    updates = rows.prepare(reqs=[_req("fresh", [1, 2, 3], [], row=1)], prefix_lens=[0],
                           seq_lens=[3], defer_new_owners=True)
    assert updates.host_sections.owners.values.tolist() == [chain_after_scalar(tokens=[])]


def test_an_eagle_draft_row_holds_the_request_s_tokens_from_index_1() -> None:
    """The EAGLE draft pool's slot ``p`` holds the token of ``p + 1``: with ``history_offset=1``
    the row's history and owner chains are those of ``(origin + output)[1:]``, whole, as tails
    (across the prompt/output boundary) and for deferred admissions."""
    rows = _rows(history_tails=True, history_offset=1)
    a, b = _req("a", [1, 2, 3], [], row=3), _req("b", [7], [], row=1)
    first = rows.prepare(reqs=[a, b], prefix_lens=[1, 0], seq_lens=[3, 1])
    assert first.host_sections.history.req_all_ids_lens.tolist() == [2, 0]
    assert _flat(first) == [2, 3]
    assert first.host_sections.owners.values.tolist() == [chain_after_scalar(tokens=[2]),
                                                          chain_after_scalar(tokens=[])]
    rows.commit(first)
    a.output_ids += [4, 5]
    b.output_ids.append(8)
    tails = rows.prepare(reqs=[a, b], prefix_lens=[3, 1], seq_lens=[4, 2])
    assert tails.host_sections.history.req_all_ids_lens.tolist() == [4, 1]
    assert _flat(tails) == [4, 5, 8]
    assert tails.host_sections.owners.rows.tolist() == []
    c = _req("c", [9, 10, 11], [12], row=2)
    early = rows.prepare(reqs=[c], prefix_lens=[2], seq_lens=[3], defer_new_owners=True)
    late = rows.prepare_deferred(early.deferred)
    assert _flat(late) == [10, 11, 12]
    assert late.host_sections.admissions.chains.tolist() == [chain_after_scalar(tokens=[10, 11])]
    with pytest.raises(ValueError, match="history_offset must be 0 or 1, got 2"):
        RequestRows(num_rows=2, token_history=True, owner_chains=True, pin_memory=False,
                    history_offset=2)


def test_an_admission_that_writes_nothing_or_outruns_its_tokens_is_not_checked() -> None:
    rows = RequestRows(num_rows=4, token_history=False, owner_chains=True, pin_memory=False)
    idle, short = _req("idle", [1, 2], [], row=1), _req("short", [3], [], row=2)
    early = rows.prepare(reqs=[idle, short], prefix_lens=[2, 4], seq_lens=[2, 5],
                         defer_new_owners=True)
    late = rows.prepare_deferred(early.deferred)
    assert late.host_sections.admissions.rows.tolist() == [] and late.unknown_owner_rows == 1


def test_an_empty_batch_uploads_nothing() -> None:
    updates = _rows().prepare(reqs=[], prefix_lens=[], seq_lens=[])
    assert updates.empty and updates.history_tokens_and_lens() is None


def test_missing_req_pool_idx_names_the_request() -> None:
    req = _req("lost", [1], [], row=1)
    req.req_pool_idx = None
    with pytest.raises(ValueError, match="'lost'.*req_pool_idx=None"):
        _rows().prepare(reqs=[req], prefix_lens=[0], seq_lens=[1])


@pytest.mark.parametrize(
    "change", ["new_owner_of_row", "retracted", "outputs_replaced", "moved_to_another_row"],
)
def test_a_changed_owner_is_sent_in_full(change: str) -> None:
    rows = _rows()
    req = _req("a", [1, 2, 3], [4, 5], row=2)
    rows.commit(rows.prepare(reqs=[req], prefix_lens=[0], seq_lens=[5]))
    if change == "new_owner_of_row":
        req = _req("b", [7, 8], [9, 10, 11, 12], row=2)
    elif change == "retracted":
        req.retraction_count += 1
    elif change == "outputs_replaced":
        req.output_ids = [6, 6, 6, 6]  # a new list object
    else:
        req.req_pool_idx = 4
    updates = rows.prepare(reqs=[req], prefix_lens=[0], seq_lens=[len(req.history())])
    assert _flat(updates) == req.history()
    assert updates.host_sections.history.req_pool_indices.tolist() == [req.req_pool_idx]


def test_an_equal_but_distinct_request_object_is_a_new_owner() -> None:
    # Owners compare by identity: a request class with value equality (a dataclass) must not
    # let a new request that equals the old one inherit the row's owner chain and history.
    @dataclasses.dataclass(eq=True)
    class ValueEqualReq:
        rid: str
        origin_input_ids: list[int]
        output_ids: list[int]
        req_pool_idx: int
        retraction_count: int = 0

    rows = _rows()
    prompt, outputs = [1, 2, 3], [4]
    first = ValueEqualReq("a", prompt, outputs, 2)
    rows.commit(rows.prepare(reqs=[first], prefix_lens=[0], seq_lens=[4]))
    assert rows.prepare(reqs=[first], prefix_lens=[4], seq_lens=[4]).empty
    twin = ValueEqualReq("a", prompt, outputs, 2)  # same lists, equal by value, another object
    assert twin == first
    updates = rows.prepare(reqs=[twin], prefix_lens=[3], seq_lens=[4])
    assert updates.host_sections.owners.rows.tolist() == [2]
    assert _flat(updates) == [1, 2, 3, 4]


def test_ring_buffers_hold_the_same_upload() -> None:
    ring = UploadBufferRing(slots=4, words=64, pin_memory=False)
    ring.open(landed=lambda: 1 << 62)  # host copies: complete at once
    with_ring, plain = _rows(upload_buffers=ring), _rows()
    reqs = [_req("a", [1, 2, 3], [4], row=3), _req("c", [9], [8], row=2)]
    for rows in (with_ring, plain):
        rows.commit(updates := rows.prepare(reqs=reqs, prefix_lens=[1, 0], seq_lens=[4, 2]))
        if rows is with_ring:
            ringed = updates
        else:
            assert torch.equal(ringed.packed, updates.packed)
    assert ringed.upload_buffer is not None and ringed.upload_buffer.slot is not None


def _assert_history_holds(synced: SyncedHistory, running: list[FakeReq]) -> None:
    for req in running:
        history = req.history()
        row = req.req_pool_idx
        assert synced.lens[row].item() == len(history), req.rid
        assert synced.tokens[row, : len(history)].tolist() == history, req.rid


@pytest.mark.parametrize("kernels", [_REF, _TRITON], ids=["reference", "triton-interpreter"])
@pytest.mark.parametrize("seed", [11, 12])
def test_admissions_and_device_appends_hold_every_running_history(kernels, seed) -> None:
    """Host admissions plus the sampled tokens appended on the device keep every running
    request's whole history on the device, at every step (chunked prefill whose samples are
    discarded, decode, finishing, retraction with and without its outputs, row reuse), and the
    host sends no token but those of new owners' histories."""
    rows, width = 9, 64
    synced = SyncedHistory(history_tails=False, rows=rows, width=width, device=_DEVICE, **kernels)
    schedule = SimulatedSchedule(seed=seed, pool_rows=rows, max_prompt_len=20,
                                 max_history_len=width)
    generated = 0
    for step, batch in enumerate(schedule.forwards(60)):
        synced.forward(batch)
        generated += sum(len(row.sampled) for row in batch)
        # the forward's rows now know their tokens up to the sampled one
        for row in batch:
            expected = row.req.history() + list(row.sampled)
            assert synced.lens[row.req.req_pool_idx].item() == len(expected), (step, row.req.rid)
            assert synced.tokens[row.req.req_pool_idx, : len(expected)].tolist() == expected
    _assert_history_holds(synced, schedule.running)
    assert synced.lens[0].item() == 0 and not synced.tokens[0].any()  # padding row
    assert generated > 100
    # admissions (whole histories, retractions included) only: far fewer than all tokens moved
    assert synced.tokens_sent < generated * 3


def test_history_tails_hold_every_running_history_over_a_schedule() -> None:
    """EAGLE's policy: the host sends each row's new tokens (several per forward)."""
    rows, width = 9, 64
    synced = SyncedHistory(history_tails=True, rows=rows, width=width, device=_DEVICE, **_REF)
    schedule = SimulatedSchedule(seed=5, pool_rows=rows, max_prompt_len=20,
                                 max_history_len=width, multi_token_steps=True)
    for batch in schedule.forwards(60):
        synced.forward(batch)
        for row in batch:  # before the step's tokens reach the request: its known history
            assert synced.lens[row.req.req_pool_idx].item() == len(row.req.history())
    _assert_history_holds(synced, [])


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_rows and max_context_len must be >= 1"):
        TokenHistory(num_rows=0, max_context_len=8, device=_DEVICE, **_REF)
    with pytest.raises(ValueError, match="num_rows must be >= 1"):
        RequestRows(num_rows=0, token_history=True, owner_chains=False, pin_memory=False)
    rows = _rows(owner_chains=False)
    with pytest.raises(ValueError, match="1 requests but 1 seq_lens and 2 prefix lengths"):
        rows.prepare(reqs=[_req("a", [1], [], row=1)], prefix_lens=[0, 0], seq_lens=[1])
    with pytest.raises(ValueError, match="1 requests but 2 seq_lens"):
        rows.prepare(reqs=[_req("a", [1], [], row=1)], prefix_lens=[0], seq_lens=[1, 1])


def test_real_sglang_req_objects() -> None:
    """The attributes read from ``Req`` exist with the expected meaning in SGLang 0.5.12.post1:
    an unchanged request sends nothing, a retracted one (``reset_for_retract``) is sent again."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = [Req(rid=f"r{i}", origin_input_text="", origin_input_ids=[10 * i + 1, 10 * i + 2],
                sampling_params=SamplingParams()) for i in range(3)]
    for row, req in enumerate(reqs, start=1):
        req.req_pool_idx = row
    rows = _rows()
    rows.commit(rows.prepare(reqs=reqs, prefix_lens=[0] * 3, seq_lens=[2] * 3))
    for req in reqs:
        req.output_ids.append(100)
    assert rows.prepare(reqs=reqs, prefix_lens=[2] * 3, seq_lens=[3] * 3).empty
    reqs[0].reset_for_retract()  # bumps retraction_count
    updates = rows.prepare(reqs=reqs, prefix_lens=[0, 2, 2], seq_lens=[3, 3, 3])
    assert updates.host_sections.history.req_pool_indices.tolist() == [1]
    assert _flat(updates) == [1, 2, 100]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
