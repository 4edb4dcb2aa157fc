"""Graph-resident request ids of the decode and EAGLE-draft graph runners (capture and replay),
through the graph-runner adapters and the model runner's canary."""

import inspect
import sys
from types import SimpleNamespace

import pytest
import torch

from _batches import VOCAB_SIZE, model_runner_stub, with_canary
from _oracle_reference import oracle_token, rid_hash
from sglang.srt.kv_canary.hooks.cuda_graph_runner import (
    after_replay_prepare,
    around_capture_one_batch_size,
)
from sglang.srt.kv_canary.hooks.eagle import (
    around_draft_capture_one_batch_size,
    around_draft_replay,
)
from sglang.srt.kv_canary.batch.carrier import CanaryBatchInputs, attach_batch_inputs
from sglang.srt.kv_canary.runner.canary_runner import runner_of
from sglang.srt.kv_canary.token_oracle.request_ids import request_ids_of
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.manager import ExpectedInputs, TokenOracleManager
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

MAX_BS = 8


def _runner(**attributes: object) -> SimpleNamespace:
    """A graph runner (the attributes the adapters read) of a model runner with the oracle."""
    return SimpleNamespace(max_bs=MAX_BS, model_runner=with_canary(model_runner_stub()),
                           **attributes)


def _static_batch(bs: int, seq_lens: torch.Tensor) -> ForwardBatch:
    """A capture-time batch like CudaGraphRunner.capture_one_batch_size builds (no ids)."""
    return ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs,
                        input_ids=torch.zeros(bs, dtype=torch.int64),
                        req_pool_indices=torch.zeros(bs, dtype=torch.int64),
                        seq_lens=seq_lens[:bs], out_cache_loc=torch.zeros(bs, dtype=torch.int64),
                        seq_lens_sum=0, positions=(seq_lens[:bs] - 1).to(torch.int64))


def _live_batch(runner: SimpleNamespace, rids: list[str], rooms: list[int]) -> SimpleNamespace:
    """A replayed batch carrying its ids, as ``ForwardBatch.init_new``'s adapter leaves it."""
    batch = SimpleNamespace(batch_size=len(rids))
    attach_batch_inputs(batch, CanaryBatchInputs(
        runner=runner_of(runner.model_runner),
        rids_int=torch.tensor([rid_hash(r) for r in rids], dtype=torch.int64),
        bootstrap_room_ids_int=torch.tensor(rooms, dtype=torch.int64),
    ))
    return batch


def _model_forward(input_ids, positions, forward_batch, pp_proxy_tensors=None):
    return forward_batch


def _capture_decode(runner, bs: int, static_seq_lens: torch.Tensor) -> ForwardBatch:
    """Mimics CudaGraphRunner.capture_one_batch_size: build the batch, run the forward twice."""
    def original(runner, bs, forward, stream_idx=None):
        assert "pp_proxy_tensors" in inspect.signature(forward).parameters
        forward_batch = _static_batch(bs, static_seq_lens)
        for _ in range(2):  # warm-up run, then the captured run
            seen = forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
        return seen

    return around_capture_one_batch_size(original, runner, bs, _model_forward, None)


def test_decode_capture_batches_read_views_of_the_static_buffers() -> None:
    runner = _runner()
    seq_lens = torch.full((MAX_BS,), 1, dtype=torch.int32)
    captured = {bs: _capture_decode(runner, bs, seq_lens) for bs in (8, 4, 1)}
    buffers, rooms_buffer = request_ids_of(captured[MAX_BS])  # the whole buffers
    assert buffers.tolist() == [0] * MAX_BS
    assert rooms_buffer.tolist() == [-1] * MAX_BS
    for bs, forward_batch in captured.items():
        rids_int, rooms = request_ids_of(forward_batch)
        assert rids_int.shape == (bs,) and rids_int.data_ptr() == buffers.data_ptr()
        assert rooms.shape == (bs,)
        assert rooms.data_ptr() == rooms_buffer.data_ptr()


def test_replay_fills_raw_rows_and_resets_padded_rows() -> None:
    runner = _runner()
    capture_batch = _capture_decode(runner, 8, torch.ones(MAX_BS, dtype=torch.int32))
    buffers, rooms = request_ids_of(capture_batch)
    big = _live_batch(runner, [f"r{i}" for i in range(7)], [-1, 3, -1, -1, 11, -1, 12])
    after_replay_prepare(None, runner, big)
    assert buffers[:7].tolist() == [rid_hash(f"r{i}") for i in range(7)]
    small = _live_batch(runner, ["x", "y", "z"], [5, -1, -1])  # replayed padded: rows 3.. reset
    after_replay_prepare(None, runner, small)
    assert buffers.tolist() == [rid_hash("x"), rid_hash("y"), rid_hash("z")] + [0] * 5
    assert rooms.tolist() == [5, -1, -1] + [-1] * 5


def test_replays_of_the_same_id_tensors_skip_the_fill_and_new_ones_refill() -> None:
    runner = _runner()
    capture_batch = _capture_decode(runner, 4, torch.ones(MAX_BS, dtype=torch.int32))
    buffers, _ = request_ids_of(capture_batch)
    live = _live_batch(runner, ["a", "b"], [-1, -1])
    after_replay_prepare(None, runner, live)
    assert buffers[:2].tolist() == [rid_hash("a"), rid_hash("b")]
    buffers[0] = 123  # only a fill writes the buffers: a skipped fill leaves this mark
    after_replay_prepare(None, runner, live)  # the same tensors (a decode batch kept its rows)
    assert buffers[0].item() == 123
    after_replay_prepare(None, runner, _live_batch(runner, ["a", "b"], [-1, -1]))  # new tensors
    assert buffers[:2].tolist() == [rid_hash("a"), rid_hash("b")]


def test_in_graph_consumer_sees_the_replayed_batch() -> None:
    """fill_expected_inputs on the capture batch reads whatever the last replay filled in."""
    runner = _runner()
    static_seq_lens = torch.ones(MAX_BS, dtype=torch.int32)
    capture_batch = _capture_decode(runner, 4, static_seq_lens)
    manager = TokenOracleManager(oracle=HashOracle(vocab_size=VOCAB_SIZE))
    out = ExpectedInputs.allocate(capacity=4, device="cpu")
    for rids, seq_lens in ((["a", "b", "c"], [5, 6, 7]), (["d"], [9])):
        live = _live_batch(runner, rids, [-1] * len(rids))
        after_replay_prepare(None, runner, live)
        static_seq_lens.fill_(1)
        static_seq_lens[: len(seq_lens)] = torch.tensor(seq_lens, dtype=torch.int32)
        manager.fill_expected_inputs(forward_batch=capture_batch, expected_inputs_out=out)
        expected = [oracle_token(rid_hash(r), s - 1, VOCAB_SIZE) for r, s in zip(rids, seq_lens)]
        padded = [oracle_token(0, 0, VOCAB_SIZE)] * (4 - len(rids))  # rid 0, room -1: id 0
        assert out.tokens.tolist() == expected + padded


def test_replay_validates_the_live_batch() -> None:
    runner = _runner()
    with pytest.raises(RuntimeError, match="captured without the request-id buffers"):
        after_replay_prepare(None, runner, _live_batch(runner, ["a"], [-1]))
    _capture_decode(runner, 2, torch.ones(MAX_BS, dtype=torch.int32))
    mismatched = _live_batch(runner, ["a", "b"], [-1, -1])
    mismatched.batch_size = 3
    with pytest.raises(ValueError, match="2 ids for a replayed batch of 3 rows"):
        after_replay_prepare(None, runner, mismatched)


class _DraftWorker:
    def draft_forward(self, forward_batch):
        return request_ids_of(forward_batch)


def test_draft_capture_shadows_draft_forward_only_while_capturing() -> None:
    worker = _DraftWorker()
    runner = _runner(eagle_worker=worker)

    def original(runner, num_seqs, forward, stream_idx=0):
        forward_batch = _static_batch(num_seqs, torch.ones(MAX_BS, dtype=torch.int32))
        return runner.eagle_worker.draft_forward(forward_batch)

    rids_int, rooms = around_draft_capture_one_batch_size(original, runner, 3, None)
    buffers, rooms_buffer = around_draft_capture_one_batch_size(original, runner, MAX_BS, None)
    assert rids_int.shape == (3,) and rids_int.data_ptr() == buffers.data_ptr()
    assert rooms.data_ptr() == rooms_buffer.data_ptr()
    assert "draft_forward" not in vars(worker)  # the class method is back

    replayed = around_draft_replay(lambda runner, batch: "replayed", runner,
                                   _live_batch(runner, ["q"], [4]))
    assert replayed == "replayed"
    assert buffers.tolist() == [rid_hash("q")] + [0] * 7
    assert rooms_buffer.tolist() == [4] + [-1] * 7


def test_draft_capture_restores_draft_forward_after_an_error() -> None:
    worker = _DraftWorker()
    runner = _runner(eagle_worker=worker)

    def failing(runner, num_seqs, forward, stream_idx=0):
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        around_draft_capture_one_batch_size(failing, runner, 2, None)
    assert "draft_forward" not in vars(worker)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
