"""Per-request ids: BLAKE2b hashing, rooms (an invalid client room falls back to "no room"),
generalized-id selection, the ForwardBatch adapters."""

import hashlib
import logging
import sys

import pytest
import torch

from _batches import (
    FakeReq,
    forward_batch_from_init_new,
    model_runner_stub,
    model_worker_batch,
    with_canary,
)
from _oracle_reference import generalized_id, rid_hash
from sglang.srt.kv_canary.config import CanaryConfig, PerturbConfig
from sglang.srt.kv_canary.hooks.forward_batch import after_init_new, after_pad_inputs
from sglang.srt.kv_canary.batch.carrier import batch_inputs_of
from sglang.srt.kv_canary.token_oracle import request_ids
from sglang.srt.kv_canary.token_oracle.request_ids import (
    BatchRequestIds,
    MissingRequestIdsError,
    bootstrap_rooms_to_tensor,
    generalized_req_id,
    generalized_req_ids_of,
    hash_rids_to_tensor,
    request_ids_of,
    request_ids_to_tensors,
    select_generalized_req_ids,
    stable_hash_str_to_i64,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

# (rid, BLAKE2b digest_size=8 hex, the digest read as a little-endian signed int64)
PINNED_VECTORS = (
    ("", "e4a6a0577479b2b4", -5426141060434712860),
    ("abc", "d8bb14d833d59559", 6455300059550759896),
    ("req-0", "4ecbaedbe34f9083", -8966579018032821426),
    ("\u00fc-rid", "3a53b0cb61eab437", 4014090873644012346),
)
RIDS = ["", "abc", "req-0", "\u00fc-rid", "a" * 1000, "HEALTH_CHECK_1.5", "x y z"]


@pytest.mark.parametrize("rid,digest_hex,value", PINNED_VECTORS)
def test_pinned_blake2b_vectors(rid: str, digest_hex: str, value: int) -> None:
    digest = hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest()
    assert digest.hex() == digest_hex
    assert int.from_bytes(digest, "little", signed=True) == value
    assert stable_hash_str_to_i64(rid) == value


@pytest.mark.parametrize("rid", RIDS)
def test_stable_hash_matches_hand_computed_blake2b(rid: str) -> None:
    assert stable_hash_str_to_i64(rid) == rid_hash(rid)


def test_stable_hash_rejects_non_str() -> None:
    with pytest.raises(TypeError, match="rid must be a str"):
        stable_hash_str_to_i64(b"abc")


def test_hash_rids_to_tensor() -> None:
    tensor = hash_rids_to_tensor(rids=RIDS, device="cpu")
    assert tensor.dtype == torch.int64 and tensor.shape == (len(RIDS),)
    assert tensor.tolist() == [rid_hash(rid) for rid in RIDS]
    assert hash_rids_to_tensor(rids=[], device="cpu").shape == (0,)


def test_bootstrap_rooms_to_tensor_maps_none_to_minus_one() -> None:
    rooms = [None, 0, 7, (1 << 63) - 1, None]
    tensor = bootstrap_rooms_to_tensor(bootstrap_rooms=rooms, device="cpu")
    assert tensor.dtype == torch.int64
    assert tensor.tolist() == [-1, 0, 7, (1 << 63) - 1, -1]


INVALID_ROOMS = [-2, 1 << 63, "5", True, 2.0, [3]]


@pytest.fixture
def fresh_room_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each invalid room is warned about once per process: start from none warned."""
    monkeypatch.setattr(request_ids, "_WARNED_ROOMS", set())


@pytest.mark.parametrize("room", INVALID_ROOMS, ids=repr)
def test_an_invalid_room_falls_back_to_no_room_with_a_warning(
    room: object, fresh_room_warnings: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A client chooses its room; an invalid one must not take the scheduler down (changed
    behaviour: it used to raise)."""
    with caplog.at_level(logging.WARNING, logger=request_ids.__name__):
        tensor = bootstrap_rooms_to_tensor(bootstrap_rooms=[room, 4], device="cpu")
        bootstrap_rooms_to_tensor(bootstrap_rooms=[room], device="cpu")
    assert tensor.tolist() == [-1, 4]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"KV canary request ids: bootstrap_room={room!r} is not a valid room (an integer in "
        "[0, 2**63 - 1]); the request is identified by its rid instead"
    ]  # once per room, not once per forward


def test_request_ids_to_tensors_one_copy_two_rows() -> None:
    rids_int, rooms = request_ids_to_tensors(rids=["a", "b"], bootstrap_rooms=[None, 3],
                                             device="cpu")
    assert rids_int.tolist() == [rid_hash("a"), rid_hash("b")] and rooms.tolist() == [-1, 3]
    assert rids_int.is_contiguous() and rooms.is_contiguous()
    with pytest.raises(ValueError, match="differ in length"):
        request_ids_to_tensors(rids=["a"], bootstrap_rooms=[], device="cpu")


def test_batch_request_ids_reuse_the_tensors_while_the_requests_are_unchanged() -> None:
    ids = BatchRequestIds(device="cpu")
    first = ids.tensors_for(rids=["a", "b"], bootstrap_rooms=[None, 7])
    assert first[0].tolist() == [rid_hash("a"), rid_hash("b")] and first[1].tolist() == [-1, 7]
    again = ids.tensors_for(rids=["a", "b"], bootstrap_rooms=[None, 7])
    assert again[0] is first[0] and again[1] is first[1]
    for rids, rooms in ((["b", "a"], [7, None]), (["a", "b"], [None, 8]), (["a"], [None]),
                        (["a", "b", "c"], [None, 7, None])):
        changed = ids.tensors_for(rids=rids, bootstrap_rooms=rooms)
        assert changed[0] is not first[0]
        assert changed[0].tolist() == [rid_hash(r) for r in rids]
        assert changed[1].tolist() == [-1 if room is None else room for room in rooms]


def test_batch_request_ids_by_request_reuse_while_the_same_objects_repeat() -> None:
    ids = BatchRequestIds(device="cpu")
    reqs = [FakeReq("a"), FakeReq("b", bootstrap_room=7)]
    first = ids.tensors_for_requests(reqs)
    assert first[0].tolist() == [rid_hash("a"), rid_hash("b")] and first[1].tolist() == [-1, 7]
    assert ids.tensors_for_requests(list(reqs)) is first  # the same objects: nothing read
    # other objects with the same ids reuse by value; other ids or another order do not
    assert ids.tensors_for_requests([FakeReq("a"), FakeReq("b", bootstrap_room=7)]) is first
    for changed in ([reqs[1], reqs[0]], [reqs[0]], [reqs[0], FakeReq("b", bootstrap_room=8)]):
        tensors = ids.tensors_for_requests(changed)
        assert tensors is not first
        assert tensors[0].tolist() == [rid_hash(req.rid) for req in changed]
        assert tensors[1].tolist() == [
            -1 if req.bootstrap_room is None else req.bootstrap_room for req in changed
        ]
    # ids asked for by value in between: the same request objects are read again
    ids.tensors_for_requests(reqs)
    ids.tensors_for(rids=["x"], bootstrap_rooms=[None])
    assert ids.tensors_for_requests(reqs)[0].tolist() == [rid_hash("a"), rid_hash("b")]


def test_select_generalized_req_ids_prefers_non_negative_rooms() -> None:
    vanilla = torch.tensor([rid_hash("a"), rid_hash("b"), rid_hash("c"), -9], dtype=torch.int64)
    rooms = torch.tensor([-1, 0, 123, -1], dtype=torch.int64)
    selected = select_generalized_req_ids(vanilla_req_ids=vanilla, bootstrap_room_ids_int=rooms)
    assert selected.tolist() == [rid_hash("a"), 0, 123, -9]
    assert selected.tolist() == [generalized_id("a"), generalized_id("b", 0),
                                 generalized_id("c", 123), -9]


def test_the_host_generalized_id_is_the_tensor_rule_per_element() -> None:
    """The host form (the write-input expectations of extend forwards) and the tensor form
    agree; an invalid room falls back to the hashed rid like :func:`room_to_i64` says."""
    cases = [("a", None), ("b", 0), ("c", 123), ("d", -3), ("e", 2**64)]
    host = [generalized_req_id(rid=rid, bootstrap_room=room) for rid, room in cases]
    assert host == [generalized_id("a"), generalized_id("b", 0), generalized_id("c", 123),
                    generalized_id("d"), generalized_id("e")]
    rids_int, rooms = request_ids_to_tensors(rids=[rid for rid, _ in cases],
                                             bootstrap_rooms=[room for _, room in cases],
                                             device="cpu")
    assert select_generalized_req_ids(vanilla_req_ids=rids_int,
                                      bootstrap_room_ids_int=rooms).tolist() == host


def test_select_generalized_req_ids_without_rooms_is_the_vanilla_ids() -> None:
    vanilla = torch.tensor([rid_hash("a"), -9], dtype=torch.int64)
    selected = select_generalized_req_ids(vanilla_req_ids=vanilla, bootstrap_room_ids_int=None)
    assert selected is vanilla
    with pytest.raises(TypeError, match="int64"):
        select_generalized_req_ids(vanilla_req_ids=vanilla.to(torch.int32),
                                   bootstrap_room_ids_int=None)


def test_select_generalized_req_ids_validates() -> None:
    with pytest.raises(TypeError, match="int64"):
        select_generalized_req_ids(vanilla_req_ids=torch.zeros(2, dtype=torch.int32),
                                   bootstrap_room_ids_int=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="differ in shape"):
        select_generalized_req_ids(vanilla_req_ids=torch.zeros(2, dtype=torch.int64),
                                   bootstrap_room_ids_int=torch.zeros(3, dtype=torch.int64))


def test_missing_ids_error_names_the_variable() -> None:
    with pytest.raises(MissingRequestIdsError, match="SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"):
        request_ids_of(object())


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
def test_init_new_hook_sets_ids_on_batch_and_sampling_info(mode: ForwardMode, monkeypatch) -> None:
    reqs = [FakeReq("r0"), FakeReq("r1", bootstrap_room=42), FakeReq("r2")]
    prefixes = [0, 3, 1] if mode == ForwardMode.EXTEND else None
    batch = model_worker_batch(mode=mode, reqs=reqs, seq_lens=[4, 6, 2],
                               extend_prefix_lens=prefixes)
    forward_batch = forward_batch_from_init_new(batch, monkeypatch=monkeypatch)
    rids_int, rooms = request_ids_of(forward_batch)
    assert rids_int.tolist() == [rid_hash("r0"), rid_hash("r1"), rid_hash("r2")]
    assert rooms.tolist() == [-1, 42, -1]
    info_rids, info_rooms = request_ids_of(forward_batch.sampling_info)
    assert info_rids is rids_int and info_rooms is rooms
    assert generalized_req_ids_of(forward_batch).tolist() == [rid_hash("r0"), 42, rid_hash("r2")]
    inputs = batch_inputs_of(forward_batch)
    assert batch_inputs_of(forward_batch.sampling_info) is inputs  # one carrier on both
    assert inputs.rids_int is rids_int and inputs.bootstrap_room_ids_int is rooms
    # the rows' rids and positions are kept only for the next-token swap's log line
    assert inputs.sampled_rows is None
    swap = CanaryConfig(enable_token_oracle=True,
                        perturb=PerturbConfig(next_token_swap_prob=0.5))
    with_swap = forward_batch_from_init_new(
        batch, model_runner=with_canary(model_runner_stub(), config=swap),
        monkeypatch=monkeypatch,
    )
    sampled_rows = batch_inputs_of(with_swap).sampled_rows
    assert list(sampled_rows.rids) == ["r0", "r1", "r2"]
    assert sampled_rows.next_positions.tolist() == [4, 6, 2]


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
def test_invalid_client_rooms_through_init_new_fall_back_to_the_rid(
    mode: ForwardMode, monkeypatch: pytest.MonkeyPatch, fresh_room_warnings: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real ``ForwardBatch.init_new`` and the model runner's canary on a batch whose clients
    sent invalid rooms: no exception (the scheduler keeps serving), -1 rooms, the hashed rid as
    the generalized id, and a warning naming each room."""
    reqs = [FakeReq("neg", bootstrap_room=-5), FakeReq("big", bootstrap_room=1 << 63),
            FakeReq("str", bootstrap_room="7"), FakeReq("ok", bootstrap_room=11)]
    prefixes = [0, 2, 1, 3] if mode == ForwardMode.EXTEND else None
    batch = model_worker_batch(mode=mode, reqs=reqs, seq_lens=[4, 6, 2, 5],
                               extend_prefix_lens=prefixes)
    with caplog.at_level(logging.WARNING, logger=request_ids.__name__):
        forward_batch = forward_batch_from_init_new(batch, monkeypatch=monkeypatch)
    rids_int, rooms = request_ids_of(forward_batch)
    assert rooms.tolist() == [-1, -1, -1, 11]
    assert generalized_req_ids_of(forward_batch).tolist() == [
        rid_hash("neg"), rid_hash("big"), rid_hash("str"), 11
    ]
    assert generalized_req_ids_of(forward_batch.sampling_info).tolist() == (
        generalized_req_ids_of(forward_batch).tolist()
    )
    warned = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for room in ("-5", str(1 << 63), "'7'"):
        assert f"bootstrap_room={room} is not a valid room" in warned
    assert "bootstrap_room=11" not in warned


def test_init_new_hook_rejects_row_count_mismatch(monkeypatch) -> None:
    model_runner = with_canary(model_runner_stub())
    batch = model_worker_batch(mode=ForwardMode.DECODE, reqs=[FakeReq("a"), FakeReq("b")],
                               seq_lens=[3, 3])
    forward_batch = forward_batch_from_init_new(batch, model_runner=model_runner,
                                                monkeypatch=monkeypatch)
    batch.reqs = batch.reqs[:1]
    with pytest.raises(ValueError, match="2 rows but 1 requests"):
        after_init_new(forward_batch, ForwardBatch, batch, model_runner)


def test_padding_hook_pads_rids_with_zero_and_rooms_with_minus_one(monkeypatch) -> None:
    model_runner = with_canary(model_runner_stub())
    batch = model_worker_batch(mode=ForwardMode.DECODE,
                               reqs=[FakeReq("a", bootstrap_room=9), FakeReq("b")], seq_lens=[3, 5])
    forward_batch = forward_batch_from_init_new(batch, model_runner=model_runner,
                                                monkeypatch=monkeypatch)
    after_pad_inputs(None, forward_batch, model_runner, 5, 5)
    rids_int, rooms = request_ids_of(forward_batch)
    assert rids_int.tolist() == [rid_hash("a"), rid_hash("b"), 0, 0, 0]
    assert rooms.tolist() == [9, -1, -1, -1, -1]
    info_rids, info_rooms = request_ids_of(forward_batch.sampling_info)
    assert info_rids is rids_int and info_rooms is rooms
    assert batch_inputs_of(forward_batch.sampling_info) is batch_inputs_of(forward_batch)
    after_pad_inputs(None, forward_batch, model_runner, 5, 5)  # no-op
    assert request_ids_of(forward_batch)[0] is rids_int
    with pytest.raises(ValueError, match="cannot pad 5 id rows down to 4"):
        after_pad_inputs(None, forward_batch, model_runner, 4, 4)


def test_padding_hook_leaves_batches_without_ids_alone(monkeypatch) -> None:
    model_runner = with_canary(model_runner_stub())
    batch = model_worker_batch(mode=ForwardMode.DECODE, reqs=[FakeReq("a")], seq_lens=[3])
    parent = forward_batch_from_init_new(batch, model_runner=model_runner,
                                         monkeypatch=monkeypatch)
    child = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=1, input_ids=None,
                         req_pool_indices=None, seq_lens=None, out_cache_loc=None, seq_lens_sum=0,
                         sampling_info=parent.sampling_info)
    after_pad_inputs(None, child, model_runner, 4, 4)
    assert request_ids_of(parent.sampling_info)[0].shape == (1,)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
