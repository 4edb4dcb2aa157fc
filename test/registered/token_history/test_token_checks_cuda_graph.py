"""The token checks inside a CUDA graph: the gap of the first upstream version, closed.

Upstream filled the verify-token lengths per batch row on the eager path only, so a forward
replayed from a CUDA graph compared no token at all. Here the model runner's canary
(:class:`CanaryRunner` with the real Triton kernels, beside real SGLang pools on the GPU) is
driven through its events as SGLang drives it: its in-forward part is captured once
(``capture_decode_graph``), over static decode buffers padded like SGLang's decode graph, and
then replayed step after step (``run_forward`` around ``on_decode_replay`` and the replay) while
requests decode, finish and are replaced (row reuse). A new owner's history is uploaded by the
host; every sampled token (one per row and forward) joins the history on the device right after
``ModelRunner.sample`` (``on_sampled``, outside the graph), as SGLang's sample hook does. One
replay consumes a wrong input token (what the ``input_ids`` perturbation does): the record of
that slot then holds the wrong token, consistently, and

* with the write-input assert, the same replay reports ``write_token`` (the oracle's token,
  computed inside the graph from graph-resident request ids);
* verify-token reports ``verify_token`` at that position in every later replay that verifies
  the slot, with or without the write-input assert;
* no chain / position reason fires, and nothing fires before the fault.
"""

import sys
from types import SimpleNamespace

import pytest
import torch
from _history_schedule import FakeReq

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_KERNEL_RUNS,
    COUNTER_VIOLATIONS,
    CheckKind,
    Reason,
)
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.monitor.violations import ViolationRow
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner, attach_canary_runner
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedServerArgs
from sglang.srt.kv_canary.token_oracle.oracle import hash_oracle_token_scalar
from sglang.srt.kv_canary.token_oracle.request_ids import stable_hash_str_to_i64
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="kv-canary-gpu")

pytestmark = pytest.mark.gpu

_DEVICE = "cuda"
_VOCAB = 1000
_ROWS = 6  # req_to_token rows (row 0: padding)
_WIDTH = 64  # positions per row; slot of (row, pos) = row * _WIDTH + pos
_MAX_BS = 4


def _oracle_token(req: FakeReq, position: int) -> int:
    return hash_oracle_token_scalar(generalized_req_id=stable_hash_str_to_i64(req.rid),
                                    position=position, vocab_size=_VOCAB)


def _i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=_DEVICE)


def _model_forward(input_ids, positions, forward_batch) -> None:
    """The stand-in model: the canary's launches around it are what is captured."""
    return None


class _Harness:
    """A model runner's canary (its events driven by hand, as SGLang's hooks call them) beside
    real pools on one GPU."""

    def __init__(self, *, write_input: bool) -> None:
        self.model_runner = SimpleNamespace(  # what the canary reads of a ModelRunner
            device=_DEVICE, page_size=1, dp_size=1, is_draft_worker=False,
            max_running_requests=_MAX_BS, server_args=SimulatedServerArgs(),
            model=SimpleNamespace(forward=_model_forward),
            model_config=SimpleNamespace(vocab_size=_VOCAB, context_len=_WIDTH - 4),
            req_to_token_pool=ReqToTokenPool(size=_ROWS - 1, max_context_len=_WIDTH,
                                             device=_DEVICE, enable_memory_saver=False),
            token_to_kv_pool=MHATokenToKVPool(
                _ROWS * _WIDTH, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=8,
                layer_num=1, device=_DEVICE, enable_memory_saver=False, enable_alt_stream=False,
            ),
        )
        config = CanaryConfig(mode=CanaryMode.LOG, ring_capacity=256,
                              enable_verify_token_assert=True,
                              enable_write_input_assert=write_input,
                              enable_token_oracle=write_input)
        self.runner = attach_canary_runner(
            model_runner=self.model_runner,
            runner=CanaryRunner(config=config, model_runner=self.model_runner,
                                kernels=load_kernels(KernelBackend.TRITON)),
        )
        self.runner.install_oracle()
        self.runner.on_memory_pool()
        self.runner.on_serving_start()
        self.state = self.runner.state
        self.req_to_token = self.model_runner.req_to_token_pool.req_to_token

    def init_new(self, batch: ForwardBatch, reqs: list[FakeReq]) -> ForwardBatch:
        """What the ``ForwardBatch.init_new`` adapter does: the batch's carrier."""
        self.runner.on_init_new(forward_batch=batch,
                                worker_batch=SimpleNamespace(reqs=reqs, seq_lens_cpu=None))
        return batch

    def prefill(self, reqs: list[FakeReq]) -> None:
        """One eager EXTEND forward over every request's whole prompt."""
        ids, positions, slots, lens = [], [], [], []
        for req in reqs:
            n = len(req.origin_input_ids)
            ids += req.origin_input_ids
            positions += list(range(n))
            slots += [req.req_pool_idx * _WIDTH + p for p in range(n)]
            lens.append(n)
            self.req_to_token[req.req_pool_idx, :n] = torch.tensor(
                slots[-n:], dtype=torch.int32, device=_DEVICE)
        starts = [sum(lens[:i]) for i in range(len(lens))]
        batch = self.init_new(ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=len(reqs), input_ids=_i64(ids),
            req_pool_indices=_i64([r.req_pool_idx for r in reqs]), seq_lens=_i64(lens),
            out_cache_loc=_i64(slots), seq_lens_sum=sum(lens), positions=_i64(positions),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int64),
            extend_prefix_lens=torch.zeros(len(reqs), dtype=torch.int32, device=_DEVICE),
            extend_seq_lens=torch.tensor(lens, dtype=torch.int32, device=_DEVICE),
            extend_start_loc=torch.tensor(starts, dtype=torch.int32, device=_DEVICE),
            extend_prefix_lens_cpu=[0] * len(reqs), extend_seq_lens_cpu=lens,
        ), reqs)
        model = self.model_runner.model
        self.runner.run_forward(
            forward_batch=batch,
            forward=lambda: model.forward(batch.input_ids, batch.positions, batch),
        )
        self.sample(batch, reqs)

    def sample(self, batch: ForwardBatch, reqs: list[FakeReq]) -> None:
        """What ``ModelRunner.sample`` and the scheduler do after the forward: each row's token
        (the oracle's, as the ``token_oracle`` sampler picks it) at the position after the
        forward, through the sample hook's event (the history append on the device), then kept
        in the request's output."""
        positions = batch.seq_lens_cpu.tolist()
        tokens = [_oracle_token(req, position) for req, position in zip(reqs, positions)]
        self.runner.on_sampled(forward_batch=batch, next_token_ids=_i64(tokens))
        for req, token in zip(reqs, tokens):
            req.output_ids.append(token)

    def violations(self) -> list[ViolationRow]:
        torch.cuda.synchronize()
        kept = min(int(self.state.counters[COUNTER_VIOLATIONS]), self.state.ring.shape[0])
        return [ViolationRow.from_ring_row(row) for row in self.state.ring[:kept].tolist()]


class _DecodeGraph:
    """Static decode buffers (``[_MAX_BS]``, padded rows: request row 0, slot 0) and the
    canary's in-forward part captured over them through ``capture_decode_graph`` (which gives
    the captured batch the graph-resident request ids), as SGLang's decode graph runner does."""

    def __init__(self, harness: _Harness) -> None:
        self.harness = harness
        self.graph_runner = SimpleNamespace(max_bs=_MAX_BS, bs=_MAX_BS,
                                            model_runner=harness.model_runner)
        self.batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=_MAX_BS,
            input_ids=_i64([0] * _MAX_BS), req_pool_indices=_i64([0] * _MAX_BS),
            seq_lens=_i64([1] * _MAX_BS), out_cache_loc=_i64([0] * _MAX_BS),
            seq_lens_sum=_MAX_BS, positions=_i64([0] * _MAX_BS),
        )
        self.graph = harness.runner.capture_decode_graph(
            graph_runner=self.graph_runner, bs=_MAX_BS, capture=self._capture,
            forward=harness.model_runner.model.forward,
        )

    def _capture(self, forward) -> torch.cuda.CUDAGraph:
        """What ``CudaGraphRunner.capture_one_batch_size`` does with the forward it is given."""
        batch = self.batch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(batch.input_ids, batch.positions, batch)  # warm-up: padding rows only
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(batch.input_ids, batch.positions, batch)
        return graph

    def replay(self, reqs: list[FakeReq], *, wrong_input: dict[str, int] | None = None) -> None:
        """One decode step of ``reqs`` through ``run_forward``: the seq_lens mirror uploaded,
        the static buffers filled (a row in ``wrong_input`` consumes that token instead of its
        own), the graph's request ids refreshed, the graph replayed; then sample (the live
        batch, as ``ModelRunner.sample`` gets it)."""
        wrong_input = wrong_input or {}
        n, pad = len(reqs), _MAX_BS - len(reqs)
        assert n <= _MAX_BS
        positions = [len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs]
        slots = [r.req_pool_idx * _WIDTH + p for r, p in zip(reqs, positions)]
        for req, position, slot in zip(reqs, positions, slots):
            self.harness.req_to_token[req.req_pool_idx, position] = slot
        inputs = [wrong_input.get(r.rid, r.output_ids[-1]) for r in reqs]
        seq_lens = [p + 1 for p in positions]
        live = self.harness.init_new(ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=n, input_ids=_i64(inputs),
            req_pool_indices=_i64([r.req_pool_idx for r in reqs]), seq_lens=_i64(seq_lens),
            out_cache_loc=_i64(slots), seq_lens_sum=sum(seq_lens), positions=_i64(positions),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        ), reqs)

        def replay() -> None:  # CudaGraphRunner.replay: populate, replay_prepare's hook, replay,
            # and the AFTER hook on replay (it counts the canary launches captured in the graph)
            static = self.batch
            static.input_ids.copy_(_i64(inputs + [0] * pad))
            static.req_pool_indices.copy_(_i64([r.req_pool_idx for r in reqs] + [0] * pad))
            static.seq_lens.copy_(_i64(seq_lens + [1] * pad))
            static.positions.copy_(_i64(positions + [0] * pad))
            static.out_cache_loc.copy_(_i64(slots + [0] * pad))
            self.harness.runner.on_decode_replay(graph_runner=self.graph_runner,
                                                 forward_batch=live)
            self.graph.replay()
            self.harness.runner.on_graph_replay(graph_runner=self.graph_runner)  # replay's hook

        self.harness.runner.run_forward(forward_batch=live, forward=replay)
        self.harness.sample(live, reqs)


def _request(rid: str, row: int, prompt_len: int) -> FakeReq:
    req = FakeReq(rid, [(7 * row + 13 * i) % _VOCAB for i in range(prompt_len)])
    req.req_pool_idx = row
    return req


@pytest.mark.parametrize("write_input", [True, False], ids=["write_input+verify", "verify"])
def test_a_wrong_token_consumed_in_a_replayed_graph_is_caught(write_input: bool) -> None:
    harness = _Harness(write_input=write_input)
    a, b, c = _request("a", 1, 9), _request("b", 2, 5), _request("c", 3, 12)
    harness.prefill([a, b, c])
    graph = _DecodeGraph(harness)  # captured after the prefill, before any decode
    runs_before = int(harness.state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY])
    for _ in range(3):
        graph.replay([a, b, c])  # padded: 3 rows in a graph of 4
    assert harness.violations() == [], "a clean replay reported a violation"

    d = _request("d", 2, 7)  # b finishes; d reuses its request row
    harness.prefill([d])
    graph.replay([a, c, d])
    assert harness.violations() == [], "row reuse: the replay compared against a stale history"

    fault_position = len(a.origin_input_ids) + len(a.output_ids) - 1
    right = a.output_ids[-1]
    graph.replay([a, c, d], wrong_input={"a": (right + 1) % _VOCAB})
    for _ in range(2):
        graph.replay([a, c, d])
    assert int(harness.state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY]) \
        == runs_before + 7 + 1  # every replay ran (and the eager prefill of d)

    rows = harness.violations()
    assert rows and all(r.position == fault_position and r.req_pool_idx == 1 for r in rows)
    assert all(r.reasons & ~int(Reason.WRITE_TOKEN | Reason.VERIFY_TOKEN) == 0 for r in rows)
    verify = [r for r in rows if r.check in (CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY)]
    # the faulty replay's post verify (it covers the token just written) and pre and post of
    # both later replays
    assert [r.check for r in verify] == [CheckKind.POST_VERIFY] + [
        CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY] * 2
    assert all(r.reasons == Reason.VERIFY_TOKEN and r.expected_token == right for r in verify)
    write = [r for r in rows if r.check == CheckKind.WRITE]
    if write_input:
        assert [(r.reasons, r.stored_token, r.expected_token) for r in write] == [
            (Reason.WRITE_TOKEN, (right + 1) % _VOCAB, right)
        ]
    else:
        assert write == []


def test_replayed_decode_steps_append_the_history_inside_the_graph() -> None:
    """A decode step's one token per row reaches the device history through the append after
    the sample (``on_sampled``): no scatter runs for those replays, the history equals the
    host's after every replayed step, its last sampled token included, and the graph's padded
    rows leave pool row 0 empty."""
    harness = _Harness(write_input=False)
    a, b, c = _request("a", 1, 9), _request("b", 2, 5), _request("c", 3, 12)
    harness.prefill([a, b, c])
    graph = _DecodeGraph(harness)
    history = harness.runner.token_checks.history
    scatters = []
    scatter = history.scatter

    def counting_scatter(**section) -> None:
        scatters.append(section)
        scatter(**section)

    history.scatter = counting_scatter  # the uploader's host-sent histories go through it
    for _ in range(4):
        graph.replay([a, b, c])  # 3 live rows in a graph of 4
        torch.cuda.synchronize()
        for req in (a, b, c):
            known = req.origin_input_ids + req.output_ids  # the last sampled one appended
            assert history.lens[req.req_pool_idx].item() == len(known)
            assert history.tokens[req.req_pool_idx, : len(known)].tolist() == known
    assert scatters == []
    assert history.lens[0].item() == 0 and not history.tokens[0].any()
    assert harness.violations() == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
