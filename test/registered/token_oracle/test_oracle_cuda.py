"""The oracle on CUDA: bit-exact tokens, pinned id copies, and fill_expected_inputs captured in a
CUDA graph (capture fails on any host sync) and replayed on new inputs."""

import sys

import pytest
import torch

from _oracle_reference import oracle_token, rid_hash
from sglang.srt.kv_canary.runner.graph_request_ids import GraphRequestIdBuffers
from sglang.srt.kv_canary.token_oracle.request_ids import request_ids_to_tensors
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.manager import (
    NO_EXPECTATION,
    ExpectedInputs,
    TokenOracleManager,
)
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=30, suite="kv-canary-gpu")

VOCAB_SIZE = 151936
MANAGER = TokenOracleManager(oracle=HashOracle(vocab_size=VOCAB_SIZE))
MAX_BS = 8


@pytest.mark.gpu
def test_hash_oracle_on_cuda_is_bit_exact() -> None:
    ids = [0, -1, (1 << 63) - 1, -(1 << 63), 123456789, -987654321] * 50
    positions = list(range(len(ids)))
    tokens = HashOracle(vocab_size=VOCAB_SIZE).expected_tokens(
        generalized_req_ids=torch.tensor(ids, dtype=torch.int64, device="cuda"),
        positions=torch.tensor(positions, dtype=torch.int64, device="cuda"),
    )
    assert tokens.tolist() == [oracle_token(i, p, VOCAB_SIZE) for i, p in zip(ids, positions)]


@pytest.mark.gpu
def test_request_ids_reach_the_device() -> None:
    rids_int, rooms = request_ids_to_tensors(rids=["a", "b"], bootstrap_rooms=[None, 9],
                                             device="cuda")
    assert rids_int.is_cuda and rooms.is_cuda
    assert rids_int.tolist() == [rid_hash("a"), rid_hash("b")] and rooms.tolist() == [-1, 9]


def _read_capture_views(forward_batch: ForwardBatch, buffers: GraphRequestIdBuffers) -> None:
    """The capture batch reads the graph-resident ids (the public id attributes, which is all
    ``fill_expected_inputs`` reads)."""
    rids_int, rooms = buffers.capture_views(forward_batch.batch_size)
    forward_batch.rids_int, forward_batch.bootstrap_room_ids_int = rids_int, rooms


def _decode_capture_batch(buffers: GraphRequestIdBuffers, seq_lens: torch.Tensor,
                          bs: int) -> ForwardBatch:
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=None,
        req_pool_indices=torch.zeros(bs, dtype=torch.int64, device="cuda"),
        seq_lens=seq_lens[:bs], out_cache_loc=None, seq_lens_sum=0,
        positions=torch.zeros(bs, dtype=torch.int64, device="cuda"),
    )
    _read_capture_views(forward_batch, buffers)
    return forward_batch


def _capture(fill) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fill()  # warm-up outside the graph, as PyTorch requires
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fill()
    return graph


@pytest.mark.gpu
def test_fill_expected_inputs_decode_replays_from_static_buffers() -> None:
    buffers = GraphRequestIdBuffers.allocate(max_bs=MAX_BS, device="cuda")
    seq_lens = torch.ones(MAX_BS, dtype=torch.int32, device="cuda")
    bs = 4
    capture_batch = _decode_capture_batch(buffers, seq_lens, bs)
    out = ExpectedInputs.allocate(capacity=MAX_BS, device="cuda")
    graph = _capture(lambda: MANAGER.fill_expected_inputs(forward_batch=capture_batch,
                                                          expected_inputs_out=out))
    for rids, lens in ((["p", "q", "r"], [5, 9, 2]), (["s"], [40])):
        rids_int, rooms = request_ids_to_tensors(rids=rids, bootstrap_rooms=[None] * len(rids),
                                                 device="cuda")
        buffers.fill(rids_int=rids_int, bootstrap_room_ids_int=rooms)  # what a replay does
        seq_lens.fill_(1)
        seq_lens[: len(lens)] = torch.tensor(lens, dtype=torch.int32, device="cuda")
        graph.replay()
        expected = [oracle_token(rid_hash(r), n - 1, VOCAB_SIZE) for r, n in zip(rids, lens)]
        expected += [oracle_token(0, 0, VOCAB_SIZE)] * (bs - len(rids))
        assert out.tokens[:bs].tolist() == expected
        assert out.positions[:bs].tolist() == [n - 1 for n in lens] + [0] * (bs - len(rids))


@pytest.mark.gpu
def test_fill_expected_inputs_extend_and_verify_are_capturable() -> None:
    """Extend (searchsorted expansion) and target verify (blocks) capture without host syncs."""
    buffers = GraphRequestIdBuffers.allocate(max_bs=MAX_BS, device="cuda")
    buffers.rids_int[:2] = torch.tensor([rid_hash("e0"), rid_hash("e1")], device="cuda")
    lens = torch.tensor([3, 2], dtype=torch.int32, device="cuda")
    prefixes = torch.tensor([4, 0], dtype=torch.int32, device="cuda")
    extend_batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=2, input_ids=None, req_pool_indices=None,
        seq_lens=lens + prefixes, out_cache_loc=None, seq_lens_sum=0,
        positions=torch.zeros(6, dtype=torch.int64, device="cuda"),  # 5 tokens + 1 padding
        extend_seq_lens=lens, extend_prefix_lens=prefixes,
    )
    _read_capture_views(extend_batch, buffers)
    block = 3
    verify_seq_lens = torch.tensor([7, 11], dtype=torch.int32, device="cuda")
    verify_batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=2, input_ids=None,
        req_pool_indices=None, seq_lens=verify_seq_lens, out_cache_loc=None, seq_lens_sum=0,
        positions=torch.zeros(2 * block, dtype=torch.int64, device="cuda"),
        spec_info=EagleVerifyInput(
            draft_token=None, custom_mask=None, positions=None, retrieve_index=None,
            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
            spec_steps=block - 1, topk=1, draft_token_num=block,
            capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None, seq_lens_cpu=None),
    )
    _read_capture_views(verify_batch, buffers)
    extend_out = ExpectedInputs.allocate(capacity=16, device="cuda")
    verify_out = ExpectedInputs.allocate(capacity=16, device="cuda")

    def fill() -> None:
        MANAGER.fill_expected_inputs(forward_batch=extend_batch, expected_inputs_out=extend_out)
        MANAGER.fill_expected_inputs(forward_batch=verify_batch, expected_inputs_out=verify_out)

    graph = _capture(fill)
    lens.copy_(torch.tensor([1, 4], dtype=torch.int32))
    prefixes.copy_(torch.tensor([9, 2], dtype=torch.int32))
    verify_seq_lens.copy_(torch.tensor([20, 3], dtype=torch.int32))
    graph.replay()
    assert extend_out.positions[:6].tolist() == [9, 2, 3, 4, 5, NO_EXPECTATION]
    assert extend_out.tokens[:6].tolist() == [NO_EXPECTATION] * 6
    assert verify_out.positions[:6].tolist() == [20, 21, 22, 3, 4, 5]
    assert verify_out.tokens[:6].tolist() == [
        oracle_token(rid_hash("e0"), 20, VOCAB_SIZE), NO_EXPECTATION, NO_EXPECTATION,
        oracle_token(rid_hash("e1"), 3, VOCAB_SIZE), NO_EXPECTATION, NO_EXPECTATION,
    ]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
