"""Request-row bookkeeping and the device token history on CPU (Triton kernel interpreted).

:class:`RequestRows` packs what one forward uploads and :class:`TokenHistory` scatters it; the
incremental bookkeeping must leave exactly the history the full one (``incremental=False``)
leaves, over a schedule with arrivals, chunked prefill, decode, finishing, retraction and row
reuse, while carrying far fewer tokens.
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


@pytest.fixture(autouse=True)
def _cpu_only() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU variant; test_token_history_gpu.py covers CUDA")


def _req(rid: str, prompt: list[int], outputs: list[int], row: int) -> FakeReq:
    req = FakeReq(rid, prompt)
    req.output_ids = outputs
    req.req_pool_idx = row
    return req


def _synced(*, incremental: bool, rows: int = 6, width: int = 16,
            scatter=scatter_req_token_ids_torch_reference,
            append=append_history_ref.launch_append_history_tokens) -> SyncedHistory:
    return SyncedHistory(incremental=incremental, rows=rows, width=width, device=_DEVICE,
                         scatter=scatter, append=append)


def _open_ring(*, slots: int, words: int) -> UploadBufferRing:
    """A ring whose copies (host copies here) count as complete at once."""
    ring = UploadBufferRing(slots=slots, words=words, pin_memory=False)
    ring.open(landed=lambda: 1 << 62)
    return ring


def _flat(updates: RowUpdates) -> list[int]:
    return updates.token_history.req_all_ids_flat.tolist()


def test_full_updates_layout() -> None:
    reqs = [_req("a", [1, 2, 3], [4], row=3), _req("b", [], [], row=1), _req("c", [9], [8], row=2)]
    rows = RequestRows(num_rows=6, token_history=True, owner_chains=False, pin_memory=False,
                       incremental=False)
    updates = rows.prepare(reqs=reqs, prefix_lens=[0, 0, 0], seq_lens=[4, 1, 2])
    assert updates.seq_lens.values.tolist() == [4, 1, 2]
    # the header (0: not one token per row), then the seq_lens mirror
    assert updates.packed[:4].tolist() == [0, 4, 1, 2] and not updates.unit_append
    history = updates.token_history
    assert history.req_pool_indices.tolist() == [3, 1, 2]
    assert history.req_all_ids_lens.tolist() == [4, 0, 2]
    assert history.offsets.tolist() == [0, 4, 4, 6]
    assert history.req_all_ids_flat.tolist() == [1, 2, 3, 4, 9, 8]
    assert updates.packed.dtype == torch.int64 and updates.packed.device.type == "cpu"
    # one buffer (one host-to-device copy): header, seq_lens (3), rows, lengths, offsets, tokens
    assert updates.packed.shape == (1 + 3 + 3 * 3 + 1 + 6,)
    seq_lens, history_view, owners, admissions = updates.sections_on(updates.packed.clone())
    assert seq_lens.values.tolist() == [4, 1, 2]
    assert history_view.req_all_ids_flat.tolist() == [1, 2, 3, 4, 9, 8]
    assert owners is None and admissions is None
    assert updates.owners is None
    assert updates.commit_rows == (3, 1, 2) and updates.commit_history_lens == (4, 0, 2)


def test_a_decode_step_s_upload_says_one_token_per_row_in_its_header() -> None:
    """The header holds the row count exactly when every row sends one token and the seq_lens
    section has a word per row: the layout the append reads from the device upload area."""
    rows = RequestRows(num_rows=6, token_history=True, owner_chains=True, pin_memory=False)
    a, b = _req("a", [1, 2, 3], [4], row=3), _req("b", [5], [6], row=1)
    first = rows.prepare(reqs=[a, b], prefix_lens=[0, 0], seq_lens=[4, 2])
    assert not first.unit_append and first.packed[0].item() == 0  # whole histories
    rows.commit(first)
    a.output_ids.append(7)
    b.output_ids.append(8)
    step = rows.prepare(reqs=[a, b], prefix_lens=[4, 2], seq_lens=[5, 3])
    assert step.unit_append
    n = 2  # header, seq_lens, rows, history lengths, offsets, tokens
    assert step.packed.tolist() == [n, 5, 3, 3, 1, 5, 3, 0, 1, 2, 7, 8]
    assert step.packed[1 + n : 1 + 2 * n].tolist() == [3, 1]  # where the append reads rows,
    assert step.packed[1 + 2 * n : 1 + 3 * n].tolist() == [5, 3]  # lengths
    assert step.packed[2 + 4 * n : 2 + 5 * n].tolist() == [7, 8]  # and tokens
    rows.commit(step)
    a.output_ids += [9, 10]
    b.output_ids.append(11)
    two = rows.prepare(reqs=[a, b], prefix_lens=[5, 3], seq_lens=[7, 4])
    assert not two.unit_append and two.packed[0].item() == 0  # a row sends two tokens

    deferring = RequestRows(num_rows=6, token_history=True, owner_chains=True, pin_memory=False)
    c = _req("c", [5], [], row=2)  # a one-token history, admitted by an extend
    reset = deferring.prepare(reqs=[c], prefix_lens=[0], seq_lens=[1], defer_new_owners=True)
    assert not reset.unit_append
    deferred = deferring.prepare_deferred(reset.deferred)
    assert not deferred.unit_append and deferred.packed[0].item() == 0  # no seq_lens section


def test_a_step_that_adds_no_token_says_its_history_is_unchanged() -> None:
    """SGLang's overlap scheduler prepares the first decode step after a prefill before the
    prefill's token reaches ``output_ids``: that steady step adds nothing, and its upload says
    so (the runner launches no scatter for it); the next step is a unit append again."""
    rows = RequestRows(num_rows=6, token_history=True, owner_chains=True, pin_memory=False)
    a, b = _req("a", [1, 2, 3], [], row=3), _req("b", [5, 6], [], row=1)
    prefill = rows.prepare(reqs=[a, b], prefix_lens=[0, 0], seq_lens=[3, 2])
    assert not prefill.history_unchanged
    rows.commit(prefill)
    early = rows.prepare(reqs=[a, b], prefix_lens=[3, 2], seq_lens=[4, 3])
    assert early.history_unchanged and not early.unit_append
    assert early.token_history.req_all_ids_lens.tolist() == [3, 2]  # what the device holds
    assert early.token_history.req_all_ids_flat.numel() == 0
    rows.commit(early)
    a.output_ids.append(7)
    b.output_ids.append(8)
    step = rows.prepare(reqs=[a, b], prefix_lens=[3, 2], seq_lens=[4, 3])
    assert step.unit_append and not step.history_unchanged
    rows.commit(step)
    a.output_ids.append(9)  # b adds nothing: not every row is unchanged
    mixed = rows.prepare(reqs=[a, b], prefix_lens=[4, 3], seq_lens=[5, 4])
    assert not mixed.history_unchanged and not mixed.unit_append


@pytest.mark.parametrize("token_history", [True, False], ids=["with-history", "chains-only"])
def test_new_owners_get_the_chain_of_their_own_tokens(token_history: bool) -> None:
    a, b = _req("a", [1, 2, 3], [4], row=3), _req("b", [7, 8], [], row=1)
    rows = RequestRows(num_rows=6, token_history=token_history, owner_chains=True,
                       pin_memory=False)
    first = rows.prepare(reqs=[a, b], prefix_lens=[4, 0], seq_lens=[5, 2])
    assert first.owners.rows.tolist() == [3, 1]
    assert first.owners.values.tolist() == [chain_after_scalar(tokens=[1, 2, 3, 4]),
                                            chain_after_scalar(tokens=[])]
    rows.commit(first)
    a.output_ids.append(5)
    c = _req("c", [9, 10, 11 + (1 << 40)], [], row=2)  # a token id above 32 bits
    second = rows.prepare(reqs=[a, c, b], prefix_lens=[5, 2, 2], seq_lens=[6, 3, 2])
    assert second.owners.rows.tolist() == [2]  # only the new owner
    assert second.owners.values.tolist() == [chain_after_scalar(tokens=[9, 10])]
    if token_history:  # a's tail, c's whole history, b's (empty) tail, in row order
        assert second.token_history.req_all_ids_flat.tolist() == [5, 9, 10, 11 + (1 << 40)]
        assert second.token_history.offsets.tolist() == [0, 1, 4, 4]
    else:
        assert second.token_history is None


@pytest.mark.parametrize("token_history", [True, False], ids=["with-history", "chains-only"])
def test_deferred_admissions_reset_the_row_first_and_send_its_tokens_later(
    token_history: bool,
) -> None:
    a, b = _req("a", [1, 2, 3], [4], row=3), _req("b", [7, 8, 9], [], row=1)
    rows = RequestRows(num_rows=6, token_history=token_history, owner_chains=True,
                       pin_memory=False)
    rows.commit(rows.prepare(reqs=[a], prefix_lens=[3], seq_lens=[4]))
    a.output_ids.append(5)
    early = rows.prepare(reqs=[a, b], prefix_lens=[4, 2], seq_lens=[5, 3],
                         defer_new_owners=True)
    # a continues as before; b's row is only reset: owner chain unknown, no known tokens
    assert [d.row for d in early.deferred] == [1] and early.deferred[0].prefix_len == 2
    assert early.owners.rows.tolist() == [1] and early.owners.values.tolist() == [0]
    assert early.admissions is None
    if token_history:
        assert early.token_history.req_all_ids_lens.tolist() == [5, 0]
        assert early.token_history.req_all_ids_flat.tolist() == [5]
    assert early.commit_rows == (3,)  # b's row keeps its previous owner until the late commit
    late = rows.prepare_deferred(early.deferred)
    assert late.seq_lens.values.tolist() == [] and late.owners is None
    assert late.admissions.rows.tolist() == [1]
    assert late.admissions.prefix_lens.tolist() == [2]
    assert late.admissions.chains.tolist() == [chain_after_scalar(tokens=[7, 8])]
    if token_history:
        assert late.token_history.req_all_ids_lens.tolist() == [3]
        assert late.token_history.req_all_ids_flat.tolist() == [7, 8, 9]
    else:
        assert late.token_history is None
    rows.commit(early)
    # the late part never uploaded: b is still a new owner, deferred again
    again = rows.prepare(reqs=[b], prefix_lens=[2], seq_lens=[3], defer_new_owners=True)
    assert [d.row for d in again.deferred] == [1]
    rows.commit(again)
    rows.commit(rows.prepare_deferred(again.deferred))
    b.output_ids.append(10)
    known = rows.prepare(reqs=[b], prefix_lens=[3], seq_lens=[4], defer_new_owners=True)
    assert known.deferred == () and known.owners.rows.tolist() == []
    if token_history:
        assert known.token_history.req_all_ids_flat.tolist() == [10]


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
    rows = RequestRows(num_rows=6, token_history=True, owner_chains=True, pin_memory=False)
    early = rows.prepare(reqs=[fresh, cached, chunk], prefix_lens=[0, 1, 0], seq_lens=[3, 2, 2],
                         defer_new_owners=True)
    assert reads == []
    assert [d.row for d in early.deferred] == [1, 2, 3]
    assert early.token_history.req_all_ids_lens.tolist() == [0, 0, 0]
    assert early.owners.values.tolist() == [UNKNOWN_OWNER_CHAIN] * 3
    assert early.commit_rows == () and early.read_whole == ()
    late = rows.prepare_deferred(early.deferred)
    assert reads == [3, 2, 4]
    assert late.token_history.req_all_ids_flat.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert [(row, tokens.tolist()) for row, tokens in late.read_whole] == [
        (1, [1, 2, 3]), (2, [4, 5]), (3, [6, 7, 8, 9])]
    assert late.admissions.rows.tolist() == [2]
    assert late.admissions.prefix_lens.tolist() == [1]
    assert late.admissions.chains.tolist() == [chain_after_scalar(tokens=[4])]
    owners_only = RequestRows(num_rows=6, token_history=False, owner_chains=True,
                              pin_memory=False)
    early = owners_only.prepare(reqs=[cached], prefix_lens=[1], seq_lens=[2],
                                defer_new_owners=True)
    assert owners_only.prepare_deferred(early.deferred).read_whole == ()


def test_without_a_token_history_no_fresh_row_is_deferred() -> None:
    """Owner chains only: a new owner without a cached prefix has nothing to read (its chain is
    the anchor), so it is never deferred, whatever it writes; one with a cached prefix is."""
    fresh, chunk, cached = (_req("fresh", [1, 2, 3], [], row=1), _req("chunk", [6, 7, 8, 9], [], row=3),
                            _req("cached", [4, 5], [], row=2))
    rows = RequestRows(num_rows=6, token_history=False, owner_chains=True, pin_memory=False)
    early = rows.prepare(reqs=[fresh, chunk, cached], prefix_lens=[0, 0, 1], seq_lens=[3, 2, 2],
                         defer_new_owners=True)
    assert [d.row for d in early.deferred] == [2]
    assert early.owners.rows.tolist() == [1, 3, 2]
    anchor = chain_after_scalar(tokens=[])
    assert early.owners.values.tolist() == [anchor, anchor, 0]
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
    assert updates.owners.values.tolist() == [chain_after_scalar(tokens=[])]


def test_an_eagle_draft_row_holds_the_request_s_tokens_from_index_1() -> None:
    """The EAGLE draft pool's slot ``p`` holds the token of ``p + 1``: with ``history_offset=1``
    the row's history and owner chains are those of ``(origin + output)[1:]``, whole, as tails
    (across the prompt/output boundary) and for deferred admissions."""
    rows = RequestRows(num_rows=6, token_history=True, owner_chains=True, pin_memory=False,
                       history_offset=1)
    a, b = _req("a", [1, 2, 3], [], row=3), _req("b", [7], [], row=1)
    first = rows.prepare(reqs=[a, b], prefix_lens=[1, 0], seq_lens=[3, 1])
    assert first.token_history.req_all_ids_lens.tolist() == [2, 0]
    assert first.token_history.req_all_ids_flat.tolist() == [2, 3]
    assert first.owners.values.tolist() == [chain_after_scalar(tokens=[2]),
                                            chain_after_scalar(tokens=[])]
    rows.commit(first)
    a.output_ids += [4, 5]
    b.output_ids.append(8)
    tails = rows.prepare(reqs=[a, b], prefix_lens=[3, 1], seq_lens=[4, 2])
    assert tails.token_history.req_all_ids_lens.tolist() == [4, 1]
    assert tails.token_history.req_all_ids_flat.tolist() == [4, 5, 8]
    assert tails.owners.rows.tolist() == []
    c = _req("c", [9, 10, 11], [12], row=2)
    early = rows.prepare(reqs=[c], prefix_lens=[2], seq_lens=[3], defer_new_owners=True)
    late = rows.prepare_deferred(early.deferred)
    assert late.token_history.req_all_ids_flat.tolist() == [10, 11, 12]
    assert late.admissions.chains.tolist() == [chain_after_scalar(tokens=[10, 11])]
    with pytest.raises(ValueError, match="history_offset must be 0 or 1, got 2"):
        RequestRows(num_rows=2, token_history=True, owner_chains=True, pin_memory=False,
                    history_offset=2)


def test_an_admission_that_writes_nothing_or_outruns_its_tokens_is_not_checked() -> None:
    rows = RequestRows(num_rows=4, token_history=False, owner_chains=True, pin_memory=False)
    idle, short = _req("idle", [1, 2], [], row=1), _req("short", [3], [], row=2)
    early = rows.prepare(reqs=[idle, short], prefix_lens=[2, 4], seq_lens=[2, 5],
                         defer_new_owners=True)
    late = rows.prepare_deferred(early.deferred)
    assert late.admissions.rows.tolist() == [] and late.unknown_owner_rows == 1


def test_empty_batch_updates_and_upload() -> None:
    synced = _synced(incremental=True)
    updates = synced.prepare([])
    assert _flat(updates) == [] and updates.token_history.offsets.tolist() == [0]
    synced.upload(updates)
    assert not synced.tokens.any() and not synced.lens.any()


def test_missing_req_pool_idx_names_the_request() -> None:
    req = _req("lost", [1], [], row=1)
    req.req_pool_idx = None
    for incremental in (True, False):
        with pytest.raises(ValueError, match="'lost'.*req_pool_idx=None"):
            _synced(incremental=incremental).prepare([req])


def test_incremental_carries_only_new_tokens_once_uploaded() -> None:
    synced = _synced(incremental=True)
    req = _req("a", [1, 2, 3], [4], row=2)
    first = synced.prepare([req])
    again = synced.prepare([req])  # not uploaded yet: nothing is assumed written
    assert _flat(first) == _flat(again) == [1, 2, 3, 4]
    synced.upload(again)
    assert _flat(synced.prepare([req])) == []  # nothing new
    req.output_ids.append(5)
    step = synced.prepare([req])
    assert _flat(step) == [5]
    assert step.token_history.req_all_ids_lens.tolist() == [5]
    synced.upload(step)
    assert synced.tokens[2, :5].tolist() == [1, 2, 3, 4, 5]
    assert synced.lens[2].item() == 5


@pytest.mark.parametrize(
    "change",
    ["new_owner_of_row", "retracted", "outputs_replaced", "history_shrank_in_place"],
)
def test_incremental_rewrites_row_from_zero_when_ownership_changes(change: str) -> None:
    synced = _synced(incremental=True)
    req = _req("a", [1, 2, 3], [4, 5], row=2)
    synced.upload(synced.prepare([req]))
    if change == "new_owner_of_row":
        req = _req("b", [7, 8], [9, 10, 11, 12], row=2)
    elif change == "retracted":
        req.retraction_count += 1
    elif change == "outputs_replaced":
        req.output_ids = [6, 6, 6, 6]  # a new list object, longer than what was synced
    else:
        del req.output_ids[:]
        req.output_ids.append(6)  # same list objects, a shorter history
    updates = synced.prepare([req])
    assert _flat(updates) == req.history()
    synced.upload(updates)
    assert synced.tokens[2, : len(req.history())].tolist() == req.history()


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

    rows = RequestRows(num_rows=4, token_history=True, owner_chains=True, pin_memory=False)
    prompt, outputs = [1, 2, 3], [4]
    first = ValueEqualReq("a", prompt, outputs, 2)
    rows.commit(rows.prepare(reqs=[first], prefix_lens=[0], seq_lens=[4]))
    assert rows.prepare(reqs=[first], prefix_lens=[4], seq_lens=[4]).owners.rows.tolist() == []
    twin = ValueEqualReq("a", prompt, outputs, 2)  # same lists, equal by value, another object
    assert twin == first
    updates = rows.prepare(reqs=[twin], prefix_lens=[3], seq_lens=[4])
    assert updates.owners.rows.tolist() == [2]
    assert _flat(updates) == [1, 2, 3, 4]


def test_row_moved_to_another_row_is_written_in_full() -> None:
    synced = _synced(incremental=True)
    req = _req("a", [1, 2], [3], row=1)
    synced.upload(synced.prepare([req]))
    req.req_pool_idx = 4
    updates = synced.prepare([req])
    assert _flat(updates) == [1, 2, 3]
    synced.upload(updates)
    assert synced.tokens[4, :3].tolist() == [1, 2, 3] and synced.lens[4].item() == 3


def _assert_history_holds(synced: SyncedHistory, batch: list[FakeReq]) -> None:
    width = synced.tokens.shape[1]
    for req in batch:
        history = req.history()
        assert synced.lens[req.req_pool_idx].item() == len(history)
        kept = history[:width]
        assert synced.tokens[req.req_pool_idx, : len(kept)].tolist() == kept, req.rid


@pytest.mark.parametrize("steady", [False, True], ids=["mixed", "mostly-decode"])
def test_incremental_and_full_give_identical_histories_over_a_schedule(steady: bool) -> None:
    rows, width = 9, 48
    full = _synced(incremental=False, rows=rows, width=width)
    incremental = _synced(incremental=True, rows=rows, width=width)
    schedule = SimulatedSchedule(seed=11, pool_rows=rows, max_prompt_len=56, steady=steady)
    tokens_moved = {False: 0, True: 0}
    for step, batch in enumerate(schedule.batches(70)):
        if step % 9 == 4:  # updates that are never uploaded must not leave a gap
            incremental.prepare(batch)
        for synced in (full, incremental):
            updates = synced.prepare(batch)
            tokens_moved[synced.incremental] += len(_flat(updates))
            synced.upload(updates)
        assert torch.equal(full.tokens, incremental.tokens), f"step {step}"
        assert torch.equal(full.lens, incremental.lens), f"step {step}"
        _assert_history_holds(incremental, batch)
    assert full.lens[0].item() == 0 and not full.tokens[0].any()  # padding row
    assert tokens_moved[True] * 3 < tokens_moved[False]
    if steady:  # decode steps: one token per row, appended
        assert incremental.unit_appends > 30, incremental.unit_appends
    else:  # batches of rows between prefill chunks: nothing to scatter
        assert incremental.unchanged > 0 and full.unchanged == 0


def test_valid_lengths_are_kept_per_pool_row() -> None:
    """The kernels read ``lens[req_pool_indices[b]]``: no per-batch gather."""
    synced = _synced(incremental=True)
    synced.upload(synced.prepare([_req("a", [1, 2, 3], [], row=2), _req("b", [5], [6], row=4)]))
    assert synced.lens.tolist() == [0, 0, 3, 0, 2, 0]  # row 0 (padding) stays 0


def test_the_torch_references_can_stand_in_for_the_kernels() -> None:
    for scatter, append in (
        (scatter_req_token_ids_torch_reference, append_history_ref.launch_append_history_tokens),
        (launch_scatter_req_token_ids_kernel, append_history.launch_append_history_tokens),
    ):
        synced = _synced(incremental=True, rows=4, width=8, scatter=scatter, append=append)
        req = _req("a", [7, 8], [9], row=3)
        synced.upload(synced.prepare([req]))  # a whole history: scattered
        req.output_ids.append(10)
        synced.upload(synced.prepare([req]))  # one token: appended
        assert synced.unit_appends == 1
        assert synced.tokens[3, :5].tolist() == [7, 8, 9, 10, 0]
        assert synced.lens.tolist() == [0, 0, 0, 4]


def test_histories_longer_than_the_row_keep_their_length() -> None:
    synced = _synced(incremental=True, rows=3, width=8)
    long_prompt = list(range(1, 6000))
    synced.upload(synced.prepare([_req("long", long_prompt, [], row=1)]))
    assert synced.tokens[1].tolist() == long_prompt[:8]
    assert synced.lens[1].item() == len(long_prompt)


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_rows and max_context_len must be >= 1"):
        TokenHistory(num_rows=0, max_context_len=8, device=_DEVICE,
                     scatter=scatter_req_token_ids_torch_reference)
    with pytest.raises(ValueError, match="num_rows must be >= 1"):
        RequestRows(num_rows=0, token_history=True, owner_chains=False, pin_memory=False)
    rows = RequestRows(num_rows=4, token_history=True, owner_chains=False, pin_memory=False)
    with pytest.raises(ValueError, match="1 requests but 2 prefix lengths"):
        rows.prepare(reqs=[_req("a", [1], [], row=1)], prefix_lens=[0, 0], seq_lens=[1])
    with pytest.raises(ValueError, match="1 requests but 2 prefix lengths"):  # asked lazily
        rows.prepare(reqs=[_req("a", [1], [], row=1)], prefix_lens=lambda: [0, 0], seq_lens=[1])
    with pytest.raises(ValueError, match="1 requests but 2 seq_lens"):
        rows.prepare(reqs=[_req("a", [1], [], row=1)], prefix_lens=[0], seq_lens=[1, 1])


def test_real_sglang_req_objects() -> None:
    """The attributes read from ``Req`` exist with the expected meaning in SGLang 0.5.12.post1."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = [Req(rid=f"r{i}", origin_input_text="", origin_input_ids=[10 * i + 1, 10 * i + 2],
                sampling_params=SamplingParams()) for i in range(3)]
    for row, req in enumerate(reqs, start=1):
        req.req_pool_idx = row
    full = _synced(incremental=False)
    incremental = _synced(incremental=True)
    for step in range(4):
        for req in reqs:
            req.output_ids.append(100 + step)
        if step == 2:
            reqs[0].reset_for_retract()  # bumps retraction_count
        for synced in (full, incremental):
            synced.upload(synced.prepare(reqs))
        assert torch.equal(full.tokens, incremental.tokens)
        assert torch.equal(full.lens, incremental.lens)
    assert incremental.tokens[2, :6].tolist() == [11, 12, 100, 101, 102, 103]


@pytest.mark.parametrize(
    ("token_history", "history_offset", "ring"),
    [(True, 0, False), (False, 0, False), (True, 1, False), (True, 0, True), (True, 1, True)],
    ids=["history", "chains-only", "eagle-draft-rows", "history-ring", "eagle-draft-rows-ring"],
)
def test_steady_batches_upload_exactly_what_the_general_path_uploads(
    token_history: bool, history_offset: int, ring: bool,
) -> None:
    """The steady-batch path (decode steps of an unchanged batch) against the general per-row
    path over a schedule: the same packed upload at every step, and most steps steady. With an
    upload ring (as in a server) the steady decode steps take the unit-step pack, whose bytes,
    sections and public history views must be the general pack's."""

    def request_rows(*, steady_batches: bool) -> RequestRows:
        upload_buffers = _open_ring(slots=4, words=1 << 12) if ring and steady_batches else None
        rows = RequestRows(num_rows=10, token_history=token_history, owner_chains=True,
                           pin_memory=False, history_offset=history_offset,
                           upload_buffers=upload_buffers)
        rows._steady_batches = steady_batches
        return rows

    fast, general = request_rows(steady_batches=True), request_rows(steady_batches=False)
    steady_steps = unit_steps = 0
    original = fast._prepare_steady
    original_unit = fast._pack_unit_step

    def counting_prepare_steady(**kwargs):
        nonlocal steady_steps
        updates = original(**kwargs)
        steady_steps += updates is not None
        return updates

    def counting_unit_step(**kwargs):
        nonlocal unit_steps
        unit_steps += 1
        return original_unit(**kwargs)

    fast._prepare_steady = counting_prepare_steady
    fast._pack_unit_step = counting_unit_step
    schedule = SimulatedSchedule(seed=5, pool_rows=10, max_prompt_len=40, steady=True)
    steps = 0
    for step, batch in enumerate(schedule.batches(400)):
        if not batch:
            continue
        steps += 1
        seq_lens = [len(req.history()) for req in batch]
        prefix_lens = [n - 1 for n in seq_lens]
        if step % 37 == 5:  # a batch that never runs leaves nothing behind
            fast.prepare(reqs=batch, prefix_lens=prefix_lens, seq_lens=seq_lens)
        updates = [
            rows.prepare(reqs=batch, prefix_lens=prefix_lens, seq_lens=seq_lens)
            for rows in (fast, general)
        ]
        assert updates[0].segment_sizes == updates[1].segment_sizes, f"step {step}"
        assert torch.equal(updates[0].packed, updates[1].packed), f"step {step}"
        assert updates[0].unit_append == updates[1].unit_append, f"step {step}"
        views = [update.history_tokens_and_lens() for update in updates]
        if token_history:
            assert all(torch.equal(a, b) for a, b in zip(*views)), f"step {step}"
        for rows, update in zip((fast, general), updates):
            rows.commit(update)
    assert steady_steps > steps // 2, (steady_steps, steps)
    assert (unit_steps > steps // 2) if ring else unit_steps == 0, (unit_steps, steps)


@pytest.mark.parametrize(
    "change",
    ["retracted", "outputs_replaced", "history_shrank", "row_moved", "prompt_grew_in_place", "prompt_replaced",
     "another_request_in_the_same_place", "one_request_fewer"],
)
def test_a_batch_that_changed_is_not_taken_for_steady(change: str) -> None:
    def request_rows(*, steady_batches: bool) -> RequestRows:
        rows = RequestRows(num_rows=8, token_history=True, owner_chains=True,
                           pin_memory=False)
        rows._steady_batches = steady_batches
        return rows

    batch = [_req("a", [1, 2, 3], [4], row=2), _req("b", [5, 6], [7, 8], row=5)]
    fast, general = request_rows(steady_batches=True), request_rows(steady_batches=False)
    for _ in range(2):  # the second commit is a steady one
        for rows in (fast, general):
            rows.commit(rows.prepare(reqs=batch, prefix_lens=[3, 3], seq_lens=[4, 4]))
        batch[0].output_ids.append(9)
    a = batch[0]
    if change == "retracted":
        a.retraction_count += 1
    elif change == "outputs_replaced":
        a.output_ids = list(a.output_ids) + [10]
    elif change == "history_shrank":
        del a.output_ids[-2:]
    elif change == "row_moved":
        a.req_pool_idx = 3
    elif change == "prompt_replaced":
        a.origin_input_ids = [12, 13, 14]  # another list of the same length
    elif change == "prompt_grew_in_place":
        a.origin_input_ids.append(11)
    elif change == "another_request_in_the_same_place":
        batch[0] = _req("c", list(a.origin_input_ids), list(a.output_ids), row=2)
    else:
        batch.pop()
    seq_lens = [len(req.history()) for req in batch]
    kwargs = dict(reqs=batch, prefix_lens=[n - 1 for n in seq_lens], seq_lens=seq_lens)
    assert fast._prepare_steady(reqs=batch, seq_lens=seq_lens) is None
    assert torch.equal(fast.prepare(**kwargs).packed, general.prepare(**kwargs).packed)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
