"""The oracle's next tokens computed inside decode graphs and taken by the sampler of the replayed
batch (``token_oracle/graph_tokens.py``), through the graph-runner adapters, the model runner's
canary and its ``token_oracle`` sampler. On the CPU a "graph" re-runs the captured forward over
the static batch, which is what a CUDA graph replay does with the captured launches; the GPU test
replays a real CUDA graph."""

import sys
from types import SimpleNamespace

import pytest
import torch

from _batches import (
    VOCAB_SIZE,
    FakeReq,
    forward_batch_from_init_new,
    model_runner_stub,
    model_worker_batch,
    sampler_environment,  # noqa: F401 - fixture
    with_canary,
)
from _oracle_reference import generalized_id, oracle_token
from sglang.srt.kv_canary.hooks.cuda_graph_runner import (
    after_replay_prepare,
    around_capture_one_batch_size,
)
from sglang.srt.kv_canary.batch.carrier import CanaryBatchInputs, attach_batch_inputs
from sglang.srt.kv_canary.runner.canary_runner import runner_of
from sglang.srt.kv_canary.token_oracle.graph_tokens import GraphOracleTokens
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.token_oracle.request_ids import request_ids_to_tensors
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")
register_cuda_ci(est_time=10, suite="kv-canary-gpu")

MAX_BS = 4
REQS = [FakeReq("g0"), FakeReq("g1", bootstrap_room=7), FakeReq("g2")]


def _static_batch(mode: ForwardMode, device: str = "cpu") -> ForwardBatch:
    """A capture-time batch of ``MAX_BS`` rows like CudaGraphRunner.capture_one_batch_size's."""
    zeros = torch.zeros(MAX_BS, dtype=torch.int64, device=device)
    return ForwardBatch(forward_mode=mode, batch_size=MAX_BS, input_ids=zeros.clone(),
                        req_pool_indices=zeros.clone(), seq_lens=zeros + 1,
                        out_cache_loc=zeros.clone(), seq_lens_sum=MAX_BS,
                        positions=zeros.clone())


def _model_forward(input_ids, positions, forward_batch, pp_proxy_tensors=None):
    return None


def _capture(graph_runner, static: ForwardBatch):
    """Capture through the adapter; returns the "replay": the captured forward run again over
    the static batch."""
    captured = {}

    def original(runner, bs, forward, stream_idx=None):
        forward(static.input_ids, static.positions, static)  # warm-up
        captured["replay"] = lambda: forward(static.input_ids, static.positions, static)

    around_capture_one_batch_size(original, graph_runner, MAX_BS, _model_forward, None)
    return captured["replay"]


def _live_decode(model_runner, monkeypatch, seq_lens) -> ForwardBatch:
    return forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS, seq_lens=seq_lens),
        model_runner=model_runner, monkeypatch=monkeypatch,
    )


def _replay(graph_runner, replay, static: ForwardBatch, live: ForwardBatch) -> None:
    """CudaGraphRunner.replay: fill the static positions, replay_prepare's hook, replay."""
    rows = live.batch_size
    static.positions.zero_()
    static.positions[:rows].copy_(live.positions)
    after_replay_prepare(None, graph_runner, live)
    replay()


def _sample(sampler, live: ForwardBatch, sampling_info=None) -> torch.Tensor:
    rows = live.batch_size
    output = LogitsProcessorOutput(next_token_logits=torch.randn(rows, VOCAB_SIZE))
    return sampler(output, sampling_info or live.sampling_info, False, [0] * rows,
                   [None] * rows, live.positions)


def _expected(positions: list[int]) -> list[int]:
    return [oracle_token(generalized_id(r.rid, r.bootstrap_room), p + 1, VOCAB_SIZE)
            for r, p in zip(REQS, positions)]


@pytest.fixture
def counted_launches(monkeypatch):
    """The sampler's own oracle launches (``sample_next_tokens_by_request``), counted."""
    calls = []
    original = TokenOracleManager.sample_next_tokens_by_request

    def counting(self, **kwargs):
        calls.append(kwargs)
        return original(self, **kwargs)

    monkeypatch.setattr(TokenOracleManager, "sample_next_tokens_by_request", counting)
    return calls


class _CpuDecodeGraph:
    """A model runner's canary with one decode graph captured through the adapter, replayed on
    the CPU, and the canary's sampler."""

    def __init__(self, monkeypatch) -> None:
        self.model_runner = with_canary(model_runner_stub())
        self.graph_runner = SimpleNamespace(max_bs=MAX_BS, model_runner=self.model_runner)
        self.static = _static_batch(ForwardMode.DECODE)
        self._replay = _capture(self.graph_runner, self.static)
        self.sampler = runner_of(self.model_runner).make_sampler()
        self._monkeypatch = monkeypatch

    def live(self, seq_lens: list[int]) -> ForwardBatch:
        return _live_decode(self.model_runner, self._monkeypatch, seq_lens)

    def replay(self, live: ForwardBatch) -> None:
        _replay(self.graph_runner, self._replay, self.static, live)


def test_a_replayed_decode_graph_gives_the_sampler_its_tokens(
    sampler_environment, monkeypatch, counted_launches,
) -> None:
    graph = _CpuDecodeGraph(monkeypatch)
    for seq_lens in ([5, 9, 3], [6, 10, 4]):  # two decode steps of one batch
        live = graph.live(seq_lens)
        graph.replay(live)
        tokens = _sample(graph.sampler, live)
        assert tokens.dtype == torch.int32
        assert tokens.tolist() == _expected([s - 1 for s in seq_lens])
    assert counted_launches == [], "the sampler launched the oracle although the graph had"


def test_the_taken_tokens_outlive_the_next_replay(sampler_environment, monkeypatch) -> None:
    graph = _CpuDecodeGraph(monkeypatch)
    first = graph.live([5, 9, 3])
    graph.replay(first)
    first_tokens = _sample(graph.sampler, first)
    graph.replay(graph.live([6, 10, 4]))
    assert first_tokens.tolist() == _expected([4, 8, 2])


def test_an_offer_serves_its_own_batch_only_and_once(
    sampler_environment, monkeypatch, counted_launches,
) -> None:
    """Another batch's sampler call (a sampler delayed past the next replay, an eager forward)
    gets its own tokens from its own launch, and ends the offer."""
    graph = _CpuDecodeGraph(monkeypatch)
    replayed = graph.live([5, 9, 3])
    graph.replay(replayed)
    eager = graph.live([20, 21, 22])
    assert _sample(graph.sampler, eager).tolist() == _expected([19, 20, 21])
    assert len(counted_launches) == 1
    assert _sample(graph.sampler, replayed).tolist() == _expected([4, 8, 2])  # offer ended
    assert len(counted_launches) == 2


def test_a_target_verify_graph_computes_no_tokens_and_withdraws_an_offer(
    sampler_environment, monkeypatch, counted_launches,
) -> None:
    model_runner = with_canary(model_runner_stub())
    decode_runner = SimpleNamespace(max_bs=MAX_BS, model_runner=model_runner)
    verify_runner = SimpleNamespace(max_bs=MAX_BS, model_runner=model_runner)
    decode_static = _static_batch(ForwardMode.DECODE)
    decode_replay = _capture(decode_runner, decode_static)
    verify_static = _static_batch(ForwardMode.TARGET_VERIFY)
    _capture(verify_runner, verify_static)
    canary = runner_of(model_runner)
    assert canary.graph_ids.buffers_for(verify_runner).next_tokens.tolist() == [0] * MAX_BS
    live = _live_decode(model_runner, monkeypatch, [5, 9, 3])
    _replay(decode_runner, decode_replay, decode_static, live)
    after_replay_prepare(None, verify_runner, live)  # another graph is prepared after it
    assert _sample(canary.make_sampler(), live).tolist() == _expected([4, 8, 2])
    assert len(counted_launches) == 1


def test_graph_oracle_tokens_refuses_more_rows_than_the_graph_holds() -> None:
    handoff = GraphOracleTokens()
    info = object()
    handoff.offer(sampling_info=info, tokens=torch.arange(4, dtype=torch.int32))
    assert handoff.take(sampling_info=info, rows=5) is None
    handoff.offer(sampling_info=info, tokens=torch.arange(4, dtype=torch.int32))
    taken = handoff.take(sampling_info=info, rows=3)
    assert taken.tolist() == [0, 1, 2]
    assert handoff.take(sampling_info=info, rows=3) is None  # taken once


@pytest.mark.gpu
def test_a_real_cuda_graph_replay_gives_the_sampler_its_tokens(
    sampler_environment, monkeypatch, counted_launches,
) -> None:
    """The token launch captured into a real CUDA graph (the Triton oracle kernel) writes the
    replayed batch's tokens; the ids and positions come from the graph-resident buffers."""
    # the canary's device is the model runner's, fixed when the canary is built: its request
    # ids and graph buffers (the graph's next tokens) are allocated on the GPU
    model_runner = with_canary(model_runner_stub(device="cuda"))
    canary = runner_of(model_runner)
    graph_runner = SimpleNamespace(max_bs=MAX_BS, model_runner=model_runner)
    static = _static_batch(ForwardMode.DECODE, device="cuda")
    graph = torch.cuda.CUDAGraph()

    def original(runner, bs, forward, stream_idx=None):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(static.input_ids, static.positions, static)  # warm-up (compiles)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            forward(static.input_ids, static.positions, static)

    around_capture_one_batch_size(original, graph_runner, MAX_BS, _model_forward, None)
    sampler = canary.make_sampler()
    rids_int, rooms = request_ids_to_tensors(rids=[r.rid for r in REQS],
                                             bootstrap_rooms=[r.bootstrap_room for r in REQS],
                                             device="cuda")
    for seq_lens in ([5, 9, 3], [70000, 12, 1 << 20]):
        # a live decode batch as init_new's adapter leaves it (init_new itself needs a server)
        live = SimpleNamespace(
            batch_size=len(REQS), sampling_info=object(),
            positions=torch.tensor(seq_lens, dtype=torch.int64, device="cuda") - 1,
        )
        attach_batch_inputs(live, CanaryBatchInputs(runner=canary, rids_int=rids_int,
                                                    bootstrap_room_ids_int=rooms))
        _replay(graph_runner, graph.replay, static, live)
        output = LogitsProcessorOutput(next_token_logits=torch.randn(3, VOCAB_SIZE, device="cuda"))
        tokens = sampler(output, live.sampling_info, False, [0] * 3, [None] * 3, live.positions)
        assert tokens.tolist() == _expected([s - 1 for s in seq_lens])
    assert counted_launches == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
