"""fill_expected_inputs on real ForwardBatch objects (built by the real ForwardBatch.init_new)."""

import sys

import pytest
import torch

from _batches import VOCAB_SIZE, FakeReq, forward_batch_from_init_new, model_worker_batch
from _oracle_reference import generalized_id, oracle_token
from sglang.srt.kv_canary.token_oracle.request_ids import MissingRequestIdsError, RIDS_INT_ATTR
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.manager import (
    NO_EXPECTATION,
    ExpectedInputs,
    TokenOracleManager,
)
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

MANAGER = TokenOracleManager(oracle=HashOracle(vocab_size=VOCAB_SIZE))
REQS = [FakeReq("alpha"), FakeReq("beta", bootstrap_room=77), FakeReq("gamma")]
N = NO_EXPECTATION


def _fill(forward_batch, capacity: int = 64) -> tuple[list[int], list[int], int]:
    out = ExpectedInputs.allocate(capacity=capacity, device="cpu")
    out.tokens.fill_(-5)  # sentinel: entries past the forward must stay untouched
    out.positions.fill_(-5)
    written = MANAGER.fill_expected_inputs(forward_batch=forward_batch, expected_inputs_out=out)
    assert out.tokens[written:].eq(-5).all() and out.positions[written:].eq(-5).all()
    return out.tokens[:written].tolist(), out.positions[:written].tolist(), written


def _oracle(req: FakeReq, position: int) -> int:
    return oracle_token(generalized_id(req.rid, req.bootstrap_room), position, VOCAB_SIZE)


def test_extend_with_mixed_lengths_expands_rows_by_extend_seq_lens(monkeypatch) -> None:
    prefixes, seq_lens = [0, 5, 2], [3, 6, 6]  # extend lengths 3, 1, 4
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.EXTEND, reqs=REQS, seq_lens=seq_lens,
                           extend_prefix_lens=prefixes),
        monkeypatch=monkeypatch)
    tokens, positions, written = _fill(forward_batch)
    assert written == 8
    assert positions == [0, 1, 2, 5, 2, 3, 4, 5]
    assert positions == forward_batch.positions.tolist()
    assert tokens == [N] * 8  # prompt tokens: the request's history is the reference


def test_extend_padding_tokens_get_no_expectation(monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.MIXED, reqs=REQS[:2], seq_lens=[2, 4],
                           extend_prefix_lens=[0, 3]),
        monkeypatch=monkeypatch)
    forward_batch.positions = torch.cat([forward_batch.positions,
                                         torch.zeros(3, dtype=torch.int64)])  # DP/TP padding
    tokens, positions, written = _fill(forward_batch)
    assert written == 6
    assert positions == [0, 1, 3, N, N, N]
    assert tokens == [N] * 6


def test_decode_expects_oracle_token_at_seq_len_minus_one(monkeypatch) -> None:
    seq_lens = [4, 9, 1]
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS, seq_lens=seq_lens),
        monkeypatch=monkeypatch)
    tokens, positions, _ = _fill(forward_batch)
    assert positions == [3, 8, 0]
    assert tokens == [_oracle(req, s - 1) for req, s in zip(REQS, seq_lens)]


def test_decode_token_is_what_the_sampler_emitted_one_step_earlier() -> None:
    ids = torch.tensor([generalized_id("alpha")], dtype=torch.int64)
    sampled = MANAGER.sample_next_tokens(generalized_req_ids=ids,
                                         logits_positions=torch.tensor([10]))
    assert sampled.item() == _oracle(REQS[0], 11)


def test_dp_padded_decode_rows(monkeypatch) -> None:
    """DP-attention max-len padding turns decode into EXTEND; the original mode decides."""
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS[:2], seq_lens=[5, 7]),
        monkeypatch=monkeypatch)
    forward_batch._original_forward_mode = ForwardMode.DECODE
    forward_batch.forward_mode = ForwardMode.EXTEND
    padding = torch.zeros(2, dtype=torch.int64)
    forward_batch.positions = torch.cat([forward_batch.positions, padding])
    tokens, positions, written = _fill(forward_batch)
    assert written == 4
    assert positions == [4, 6, N, N]
    assert tokens == [_oracle(REQS[0], 4), _oracle(REQS[1], 6), N, N]


def test_eagle_draft_decode_has_no_expectation(monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS[:2], seq_lens=[5, 7],
                           spec_info=EagleDraftInput(num_tokens_per_req=1)),
        monkeypatch=monkeypatch)
    tokens, positions, written = _fill(forward_batch)
    assert written == 2 and tokens == [N, N] and positions == [N, N]


def _verify_input(*, positions: list[int], draft_token_num: int, topk: int = 1) -> EagleVerifyInput:
    return EagleVerifyInput(
        draft_token=torch.zeros(len(positions), dtype=torch.int64), custom_mask=None,
        positions=torch.tensor(positions, dtype=torch.int64), retrieve_index=None,
        retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
        spec_steps=draft_token_num - 1, topk=topk, draft_token_num=draft_token_num,
        capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None, seq_lens_cpu=None,
    )


def test_eagle_target_verify_uniform_blocks(monkeypatch) -> None:
    seq_lens, block = [4, 10], 3
    positions = [s + j for s in seq_lens for j in range(block)]
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.TARGET_VERIFY, reqs=REQS[:2], seq_lens=seq_lens,
                           spec_info=_verify_input(positions=positions, draft_token_num=block)),
        monkeypatch=monkeypatch)
    tokens, expected_positions, written = _fill(forward_batch)
    assert written == 6
    assert expected_positions == positions
    # Only the first token of each block (the bonus token at position seq_len) is the oracle's.
    assert tokens == [_oracle(REQS[0], 4), N, N, _oracle(REQS[1], 10), N, N]


def test_eagle_target_verify_refuses_trees(monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.TARGET_VERIFY, reqs=REQS[:1], seq_lens=[4],
                           spec_info=_verify_input(positions=[4, 5, 5], draft_token_num=3, topk=2)),
        monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="topk 2"):
        _fill(forward_batch)


def test_eagle_draft_extend_uniform_blocks_one_position_ahead(monkeypatch) -> None:
    old_seq_lens, block = [4, 10, 6], 3
    spec_info = EagleDraftInput(num_tokens_per_req=block,
                                num_accept_tokens=torch.tensor([1, 3, 2], dtype=torch.int32))
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DRAFT_EXTEND_V2, reqs=REQS,
                           seq_lens=[s + block for s in old_seq_lens],
                           extend_prefix_lens=old_seq_lens, spec_info=spec_info),
        monkeypatch=monkeypatch)
    tokens, positions, written = _fill(forward_batch)
    assert written == 9
    assert positions == forward_batch.positions.tolist() == [4, 5, 6, 10, 11, 12, 6, 7, 8]
    # Draft slot p holds the token at p + 1; rows accepted 1, 3 and 2 tokens.
    assert tokens == [
        _oracle(REQS[0], 5), N, N,
        _oracle(REQS[1], 11), _oracle(REQS[1], 12), _oracle(REQS[1], 13),
        _oracle(REQS[2], 7), _oracle(REQS[2], 8), N,
    ]


def test_idle_writes_nothing(monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.IDLE, reqs=[], seq_lens=[]), monkeypatch=monkeypatch)
    assert _fill(forward_batch)[2] == 0


def test_errors(monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS, seq_lens=[4, 5, 6]),
        monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="3 tokens but expected_inputs_out holds 2"):
        _fill(forward_batch, capacity=2)
    forward_batch.forward_mode = ForwardMode.DLLM_EXTEND
    with pytest.raises(ValueError, match="DLLM_EXTEND"):
        _fill(forward_batch)
    forward_batch.forward_mode = ForwardMode.DECODE
    delattr(forward_batch, RIDS_INT_ATTR)
    with pytest.raises(MissingRequestIdsError, match="SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"):
        _fill(forward_batch)


def test_expected_inputs_validation() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ExpectedInputs.allocate(capacity=0, device="cpu")
    with pytest.raises(ValueError, match="1-D int64"):
        ExpectedInputs(tokens=torch.zeros(3, dtype=torch.int32),
                       positions=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="must match"):
        ExpectedInputs(tokens=torch.zeros(3, dtype=torch.int64),
                       positions=torch.zeros(4, dtype=torch.int64))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
