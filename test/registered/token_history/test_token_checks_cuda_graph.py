"""The token checks inside a CUDA graph: the gap of the first upstream version, closed.

Upstream filled the verify-token lengths per batch row on the eager path only, so a forward
replayed from a CUDA graph compared no token at all. Here the canary's in-forward part
(``CanaryModelForward`` with the real Triton kernels and :class:`TokenChecks`) is captured once,
over static decode buffers padded like SGLang's decode graph, and then replayed step after step
while requests decode, finish and are replaced (row reuse), the history being refreshed outside
the graph before each replay. One replay consumes a wrong input token (what the ``input_ids``
perturbation does): the record of that slot then holds the wrong token, consistently, and

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

from sglang.jit_kernel.kv_canary.canary_kernels_ref import allocate_device_state
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_KERNEL_RUNS,
    COUNTER_VIOLATIONS,
    CheckKind,
    Reason,
)
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.runner.model_forward import CanaryModelForward
from sglang.srt.kv_canary.req_to_expected_token_ids_manager import ReqToVerifyExpectedTokens
from sglang.srt.kv_canary.token_oracle.request_ids import set_request_ids, stable_hash_str_to_i64
from sglang.srt.kv_canary.token_checks.checks import TokenChecks
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle, hash_oracle_token_scalar
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.monitor.violations import ViolationRow
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


class _Harness:
    """Canary state, token checks and the wrapped stand-in model forward on one GPU."""

    def __init__(self, *, write_input: bool) -> None:
        self.req_to_token = torch.zeros((_ROWS, _WIDTH), dtype=torch.int32, device=_DEVICE)
        self.state = allocate_device_state(num_slots=_ROWS * _WIDTH,
                                           req_to_token=self.req_to_token, ring_capacity=256)
        kernels = load_kernels(KernelBackend.TRITON)
        self.checks = TokenChecks(
            history=ReqToVerifyExpectedTokens(num_rows=_ROWS, max_context_len=_WIDTH,
                                              device=_DEVICE,
                                              scatter=kernels.scatter_req_token_ids()),
            verify_token=True,
            oracle=TokenOracleManager(oracle=HashOracle(vocab_size=_VOCAB)) if write_input
            else None,
            expected_capacity=2 * _MAX_BS,
        )
        self.forward = CanaryModelForward(original=lambda input_ids, positions, batch: None,
                                          state=self.state, kernels=kernels,
                                          token_checks=self.checks)
        self.checks.start_serving()

    def refresh_history(self, *, mode: ForwardMode, reqs: list[FakeReq]) -> None:
        """What the init_new hook and run_step do for a forward, outside any graph."""
        holder = SimpleNamespace(forward_mode=mode)
        self.checks.snapshot(forward_batch=holder, reqs=reqs)
        self.checks.populate_history(holder)

    def prefill(self, reqs: list[FakeReq]) -> None:
        """One eager EXTEND forward over every request's whole prompt."""
        self.refresh_history(mode=ForwardMode.EXTEND, reqs=reqs)
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
        batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=len(reqs), input_ids=_i64(ids),
            req_pool_indices=_i64([r.req_pool_idx for r in reqs]), seq_lens=_i64(lens),
            out_cache_loc=_i64(slots), seq_lens_sum=sum(lens), positions=_i64(positions),
            extend_prefix_lens=torch.zeros(len(reqs), dtype=torch.int32, device=_DEVICE),
            extend_seq_lens=torch.tensor(lens, dtype=torch.int32, device=_DEVICE),
            extend_start_loc=torch.tensor(starts, dtype=torch.int32, device=_DEVICE),
        )
        set_request_ids(batch, rids_int=_i64([stable_hash_str_to_i64(r.rid) for r in reqs]),
                        bootstrap_room_ids_int=_i64([-1] * len(reqs)))
        setattr(batch, "kv_canary_prompt_lens", _i64(lens))
        self.forward(batch.input_ids, batch.positions, batch)
        for req in reqs:
            req.output_ids.append(_oracle_token(req, len(req.origin_input_ids)))

    def violations(self) -> list[ViolationRow]:
        torch.cuda.synchronize()
        kept = min(int(self.state.counters[COUNTER_VIOLATIONS]), self.state.ring.shape[0])
        return [ViolationRow.from_ring_row(row) for row in self.state.ring[:kept].tolist()]


class _DecodeGraph:
    """Static decode buffers (``[_MAX_BS]``, padded rows: request row 0, slot 0, rid 0 / room
    -1) and the canary's in-forward part captured over them, as SGLang's decode graph runner
    and the oracle's graph-resident id buffers do."""

    def __init__(self, harness: _Harness) -> None:
        self.harness = harness
        self.batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=_MAX_BS,
            input_ids=_i64([0] * _MAX_BS), req_pool_indices=_i64([0] * _MAX_BS),
            seq_lens=_i64([1] * _MAX_BS), out_cache_loc=_i64([0] * _MAX_BS),
            seq_lens_sum=_MAX_BS, positions=_i64([0] * _MAX_BS),
        )
        set_request_ids(self.batch, rids_int=_i64([0] * _MAX_BS),
                        bootstrap_room_ids_int=_i64([-1] * _MAX_BS))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run()  # warm-up (Triton compiles) on padding rows only: checks nothing
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._run()

    def _run(self) -> None:
        batch = self.batch
        self.harness.forward(batch.input_ids, batch.positions, batch)

    def replay(self, reqs: list[FakeReq], *, wrong_input: dict[str, int] | None = None) -> None:
        """One decode step of ``reqs``: refresh the history, fill the static buffers (a row in
        ``wrong_input`` consumes that token instead of its own), replay, sample."""
        wrong_input = wrong_input or {}
        self.harness.refresh_history(mode=ForwardMode.DECODE, reqs=reqs)
        n, pad = len(reqs), _MAX_BS - len(reqs)
        positions = [len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs]
        slots = [r.req_pool_idx * _WIDTH + p for r, p in zip(reqs, positions)]
        for req, position, slot in zip(reqs, positions, slots):
            self.harness.req_to_token[req.req_pool_idx, position] = slot
        inputs = [wrong_input.get(r.rid, r.output_ids[-1]) for r in reqs]
        static = self.batch
        static.input_ids.copy_(_i64(inputs + [0] * pad))
        static.req_pool_indices.copy_(_i64([r.req_pool_idx for r in reqs] + [0] * pad))
        static.seq_lens.copy_(_i64([p + 1 for p in positions] + [1] * pad))
        static.positions.copy_(_i64(positions + [0] * pad))
        static.out_cache_loc.copy_(_i64(slots + [0] * pad))
        static.rids_int.copy_(_i64([stable_hash_str_to_i64(r.rid) for r in reqs] + [0] * pad))
        self.graph.replay()
        for req, position in zip(reqs, positions):
            req.output_ids.append(_oracle_token(req, position + 1))
        assert n <= _MAX_BS


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
    assert len(verify) == 4  # pre and post of both later replays
    assert all(r.reasons == Reason.VERIFY_TOKEN and r.expected_token == right for r in verify)
    write = [r for r in rows if r.check == CheckKind.WRITE]
    if write_input:
        assert [(r.reasons, r.stored_token, r.expected_token) for r in write] == [
            (Reason.WRITE_TOKEN, (right + 1) % _VOCAB, right)
        ]
    else:
        assert write == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
