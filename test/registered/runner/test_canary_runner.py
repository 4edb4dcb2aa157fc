"""The model runner's canary on CPU against SGLang's own objects: ``ForwardBatch`` -> batch view
for each mode, installation beside a real ``MHATokenToKVPool`` (records per slot, real-data view
of the live K bytes, ``model.forward`` wrapped with its signature kept), the per-forward host path
(live vs idle forwards, refused modes, re-entrancy, faults undone, exactly one canary launch per
live forward), and the core adapters (padded graph rows, graph (re)capture, memory budget)."""

import inspect
import logging
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout
from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    COUNTER_VIOLATIONS,
    RECORD_BYTES,
    RECORD_FIELDS,
    CheckKind,
)
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, PerturbConfig, RealDataMode
from sglang.srt.kv_canary.hooks.cuda_graph_runner import before_capture, before_populate_buffers
from sglang.srt.kv_canary.hooks.model_runner import (
    add_record_bytes_to_cell_size,
    around_forward,
    reserve_fixed_bytes,
)
from sglang.srt.kv_canary.monitor.health import CanaryHealthError
from sglang.srt.kv_canary.runner.canary_runner import (
    CanaryRunner,
    attach_canary_runner,
    runner_of,
)
from sglang.srt.kv_canary.batch.forward_kind import (
    ForwardKind,
    UnsupportedForwardModeError,
    forward_kind,
    host_prefix_lens,
)
from sglang.srt.kv_canary.runner.batch_view import build_batch_view
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.runner.launch_accounting import LaunchAccounting
from sglang.srt.kv_canary.runner.memory_budget import UPLOAD_STAGING_WORDS, fixed_buffers
from sglang.srt.kv_canary.runner.model_forward import CanaryModelForward, uninstall_model_forward
from sglang.srt.kv_canary.runner.speculative import SpeculativeCanary, UniformBlocks
from sglang.srt.kv_canary.selfcheck.scenarios import server_hooks, install_canary_runner
from sglang.srt.kv_canary.selfcheck.simulation import (
    SimulatedModelRunner,
    SimulatedRequest,
    SimulatedServer,
    SimulatedServerArgs,
    SimulatedWorkerBatch,
)
from sglang.srt.model_executor.cuda_graph_runner import DecodeInputBuffers
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="kv-canary-cpu")

_KERNELS = load_kernels(KernelBackend.TORCH_REFERENCE)
_LOG = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL)


def _decode_batch(*, req_pool_indices: list[int], seq_lens: list[int]) -> ForwardBatch:
    n = len(seq_lens)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=n,
        input_ids=torch.arange(n, dtype=torch.int64),
        req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.arange(100, 100 + n, dtype=torch.int64),
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        positions=torch.tensor(seq_lens, dtype=torch.int64) - 1,
    )


def _extend_batch(*, mode: ForwardMode, prefix_lens: list[int], extend_lens: list[int],
                  padded_rows: int = 0) -> ForwardBatch:
    """An EXTEND/MIXED batch; ``padded_rows`` as DP attention pads it (row tensors only)."""
    num_tokens = sum(extend_lens)
    rows = len(prefix_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)] + [1] * padded_rows
    return ForwardBatch(
        forward_mode=mode,
        batch_size=rows,
        input_ids=torch.arange(num_tokens, dtype=torch.int64),
        req_pool_indices=torch.tensor(list(range(1, rows + 1)) + [0] * padded_rows),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.arange(1, num_tokens + 1, dtype=torch.int64),
        seq_lens_sum=sum(seq_lens),
        positions=torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens)]),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32),
        extend_seq_lens=torch.tensor(extend_lens + [1] * padded_rows, dtype=torch.int32),
        extend_start_loc=torch.tensor([sum(extend_lens[:i]) for i in range(rows)],
                                      dtype=torch.int32),
        extend_prefix_lens_cpu=prefix_lens,
        extend_seq_lens_cpu=extend_lens,
    )


# ----------------------------------------------------------------------------- batch views


def _view(batch: ForwardBatch, host_seq_lens: torch.Tensor | None = None):
    return build_batch_view(batch, kind=forward_kind(batch), checks={},
                            host_seq_lens=host_seq_lens)


def test_decode_view_is_made_of_the_batch_tensors() -> None:
    batch = _decode_batch(req_pool_indices=[3, 0], seq_lens=[9, 1])
    view = _view(batch)
    assert view.layout is BatchLayout.DECODE
    for name in ("req_pool_indices", "seq_lens", "input_ids", "positions", "out_cache_loc"):
        assert getattr(view, name).data_ptr() == getattr(batch, name).data_ptr(), name
    assert view.extend_prefix_lens is None
    assert view.host_seq_lens is None  # no mirror given: no seq_lens invariant


def test_the_views_host_seq_lens_are_the_first_rows_of_the_persistent_mirror() -> None:
    """The mirror is one persistent buffer (graph replays read each forward's upload); a view
    takes its first ``bs`` rows, a view of it, never a copy."""
    mirror = torch.arange(10, 18, dtype=torch.int64)
    view = _view(_decode_batch(req_pool_indices=[3, 0], seq_lens=[9, 1]), mirror)
    assert view.host_seq_lens.tolist() == [10, 11]
    assert view.host_seq_lens.data_ptr() == mirror.data_ptr()
    padded = _extend_batch(mode=ForwardMode.EXTEND, prefix_lens=[2, 0], extend_lens=[3, 4],
                           padded_rows=2)
    assert _view(padded, mirror).host_seq_lens.tolist() == [10, 11]  # the prefix rows only


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.MIXED])
def test_extend_and_mixed_views_use_the_extend_layout(mode: ForwardMode) -> None:
    view = _view(_extend_batch(mode=mode, prefix_lens=[0, 4], extend_lens=[5, 1]))
    assert view.layout is BatchLayout.EXTEND
    assert view.extend_start_loc.tolist() == [0, 5]


def test_dp_attention_padded_extend_rows_are_cut_to_the_prefix_rows() -> None:
    batch = _extend_batch(mode=ForwardMode.EXTEND, prefix_lens=[2, 0], extend_lens=[3, 4],
                          padded_rows=2)
    view = _view(batch)
    assert view.batch_size == 2
    assert view.req_pool_indices.data_ptr() == batch.req_pool_indices.data_ptr()


def test_idle_has_no_view_and_other_modes_are_refused() -> None:
    assert forward_kind(SimpleNamespace(forward_mode=ForwardMode.IDLE)) is None
    for mode in (ForwardMode.DRAFT_EXTEND, ForwardMode.SPLIT_PREFILL, ForwardMode.PREBUILT,
                 ForwardMode.DLLM_EXTEND):
        with pytest.raises(UnsupportedForwardModeError, match=f"forward mode {mode.name} is not"):
            forward_kind(SimpleNamespace(forward_mode=mode))


class _SpecInput:
    def __init__(self, *, draft: bool) -> None:
        self._draft = draft

    def is_draft_input(self) -> bool:
        return self._draft


def _uniform_batch(*, mode: ForwardMode, rows: list[int], seq_lens: list[int], block: int,
                   draft: bool = False, positions: list[int] | None = None) -> SimpleNamespace:
    tokens = len(rows) * block
    return SimpleNamespace(
        forward_mode=mode, batch_size=len(rows),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        input_ids=torch.arange(tokens, dtype=torch.int64),
        positions=torch.tensor(positions if positions is not None else [0] * tokens,
                               dtype=torch.int64),
        out_cache_loc=torch.arange(1, tokens + 1, dtype=torch.int64),
        spec_info=_SpecInput(draft=draft),
        extend_prefix_lens_cpu=None,
    )


def test_eagle_forwards_are_uniform_block_views_of_the_batch() -> None:
    """TARGET_VERIFY: block D after a prefix of seq_lens; DRAFT_EXTEND_V2: the same block after
    seq_lens - D (seq_lens already count it); a draft decode step: one token after a prefix of
    its position (the EAGLE draft leaves seq_lens un-bumped). Lengths and starts are views of
    the persistent uniform blocks."""
    blocks = UniformBlocks(rows=8, blocks=(1, 3), device=torch.device("cpu"))
    verify = _uniform_batch(mode=ForwardMode.TARGET_VERIFY, rows=[4, 0], seq_lens=[7, 1],
                            block=3)
    assert forward_kind(verify) is ForwardKind.TARGET_VERIFY
    view = build_batch_view(verify, kind=ForwardKind.TARGET_VERIFY, checks={},
                            host_seq_lens=None, blocks=blocks)
    assert view.layout is BatchLayout.EXTEND
    assert view.extend_prefix_lens.data_ptr() == verify.seq_lens.data_ptr()
    assert view.extend_seq_lens.tolist() == [3, 3]
    assert view.extend_start_loc.tolist() == [0, 3]
    assert host_prefix_lens(verify) == [7, 1]

    extend = _uniform_batch(mode=ForwardMode.DRAFT_EXTEND_V2, rows=[4], seq_lens=[10], block=3,
                            draft=True)
    assert forward_kind(extend) is ForwardKind.DRAFT_EXTEND
    view = build_batch_view(extend, kind=ForwardKind.DRAFT_EXTEND, checks={},
                            host_seq_lens=None, blocks=blocks)
    assert view.extend_prefix_lens.tolist() == [7]
    assert host_prefix_lens(extend) == [7]

    step = _uniform_batch(mode=ForwardMode.DECODE, rows=[4, 5], seq_lens=[7, 9], block=1,
                          draft=True, positions=[8, 10])
    assert forward_kind(step) is ForwardKind.DRAFT_DECODE
    view = build_batch_view(step, kind=ForwardKind.DRAFT_DECODE, checks={},
                            host_seq_lens=None, blocks=blocks)
    assert view.extend_prefix_lens.data_ptr() == step.positions.data_ptr()
    assert view.extend_seq_lens.tolist() == [1, 1]
    assert view.extend_start_loc.tolist() == [0, 1]
    assert host_prefix_lens(step) == [7, 9]
    assert view.extend_seq_lens.data_ptr() == blocks.views(rows=2, block=1)[0].data_ptr()

    uneven = _uniform_batch(mode=ForwardMode.TARGET_VERIFY, rows=[4, 5], seq_lens=[7, 1],
                            block=3)
    uneven.input_ids = uneven.input_ids[:5]
    with pytest.raises(ValueError, match="same number of tokens in every row"):
        build_batch_view(uneven, kind=ForwardKind.TARGET_VERIFY, checks={},
                         host_seq_lens=None, blocks=blocks)


def test_eagle_graph_captures_count_their_launches_and_must_agree_across_sizes() -> None:
    """Every replay of an EAGLE draft / draft-extend graph enqueues the canary launches captured
    into it: the captures count them per graph runner, and sizes that captured a different
    count stop start-up (the health check could not balance them)."""
    accounting = LaunchAccounting(device=torch.device("cpu"), is_capturing=lambda: True)
    state = SimpleNamespace(device=torch.device("cpu"),
                            owner_chains=torch.zeros(4, dtype=torch.int64))
    speculative = SpeculativeCanary(
        state=state, accounting=accounting, accepted_owner_resync=lambda **_: None,
        block_rows=4, draft_tokens=3, is_draft=False, reinject_padded_row_bug=False,
    )

    def capture(launches: int):
        def run() -> str:
            for _ in range(launches):
                accounting.count_launch()
            return "graph"
        return run

    extend_runner = SimpleNamespace()
    assert accounting.capture_same_per_size(graph_runner=extend_runner, capture=capture(1)) \
        == "graph"
    with pytest.raises(CanaryHealthError, match="captured 2 canary launches for one batch size "
                                                "but 1 for another"):
        accounting.capture_same_per_size(graph_runner=extend_runner, capture=capture(2))
    draft_runner = SimpleNamespace(eagle_worker=SimpleNamespace(draft_forward=lambda b: b))
    inside: list[bool] = []

    def draft_capture() -> str:
        inside.append(speculative.in_draft_capture)  # eager warm-up forwards pass by
        return capture(2)()

    assert speculative.capture_draft_graph(graph_runner=draft_runner, capture=draft_capture,
                                           graph_ids=None) == "graph"
    assert inside == [True]
    assert not speculative.in_draft_capture
    assert accounting.launches == 0  # captured launches are not enqueued ones
    accounting.replayed_same_per_size(graph_runner=extend_runner)
    accounting.replayed_same_per_size(graph_runner=draft_runner)
    assert accounting.launches == 3


def test_decode_captures_count_per_batch_size_and_replays_add_them() -> None:
    capturing = [False]
    accounting = LaunchAccounting(device=torch.device("cpu"), is_capturing=lambda: capturing[0])
    graph_runner = SimpleNamespace()

    def capture() -> None:
        capturing[0] = True
        accounting.count_launch()
        accounting.count_publication()
        capturing[0] = False

    accounting.capture_graph(graph_runner=graph_runner, bs=8, capture=capture)
    accounting.count_launch()  # an eager forward
    assert (accounting.launches, accounting.publications) == (1, 0)
    accounting.replayed(graph_runner=graph_runner, bs=8)
    accounting.replayed(graph_runner=graph_runner, bs=4)  # never captured: nothing
    assert (accounting.launches, accounting.publications) == (2, 1)
    accounting.reset()
    assert (accounting.launches, accounting.publications, accounting.sweep_launches) == (0, 0, 0)


def test_uniform_blocks_grow_for_larger_eager_batches() -> None:
    blocks = UniformBlocks(rows=2, blocks=(4,), device=torch.device("cpu"))
    lengths, starts = blocks.views(rows=5, block=4)
    assert lengths.tolist() == [4] * 5
    assert starts.tolist() == [0, 4, 8, 12, 16]
    assert blocks.views(rows=1, block=2)[1].tolist() == [0]


# ----------------------------------------------------------------------------- installation


def _server(*, page_size: int = 1, config: CanaryConfig = _LOG, forward=None) -> SimulatedServer:
    """A simulated server whose batches go through the ``ForwardBatch.init_new`` adapters the
    configuration registers (the per-batch carrier: the seq_lens mirror, owner chains) and whose
    forwards go through the ``ModelRunner.forward`` adapter."""

    def through_hook(batch: ForwardBatch) -> object:
        return around_forward(SimulatedModelRunner.forward, server.runner, batch)

    server = SimulatedServer(page_size=page_size, num_pages=32, max_requests=8,
                             max_context_len=64, forward=forward or through_hook,
                             hooks=server_hooks(config))
    install_canary_runner(model_runner=server.runner, config=config, kernels=_KERNELS)
    return server


@pytest.mark.parametrize("page_size", [1, 4])
def test_install_keeps_one_record_per_slot_beside_the_pool(page_size: int, caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    server = _server(page_size=page_size)
    state = runner_of(server.runner).state
    keys = server.kv_pool.k_buffer[0]
    assert state.records.shape == (keys.shape[0], RECORD_FIELDS)
    assert state.req_to_token is server.req_to_token_pool.req_to_token
    # views of the live K and V bytes of the first and the last layer, 16 bytes each (partial)
    pool = server.kv_pool
    expected = [pool.k_buffer[0], pool.v_buffer[0], pool.k_buffer[-1], pool.v_buffer[-1]]
    assert [s.data_ptr() for s in state.real_data.sources] == [b.data_ptr() for b in expected]
    assert state.real_data.partial
    (line,) = [m for m in caplog.messages if m.startswith("KV canary installed: ")]
    assert "pool MHATokenToKVPool" in line and "records 32 B/slot" in line


def test_install_wraps_forward_keeping_its_signature_and_refuses_twice() -> None:
    server = _server()
    model = server.runner.model
    assert isinstance(model.forward, CanaryModelForward)
    assert list(inspect.signature(model.forward).parameters) == [
        "input_ids", "positions", "forward_batch"
    ]
    with pytest.raises(RuntimeError, match="already installed"):
        runner_of(server.runner).on_memory_pool()
    with pytest.raises(RuntimeError, match="already has a canary"):
        attach_canary_runner(
            model_runner=server.runner,
            runner=CanaryRunner(config=_LOG, model_runner=server.runner, kernels=_KERNELS),
        )


def test_runner_of_a_model_runner_without_the_canary_says_which_hook_did_not_run() -> None:
    with pytest.raises(RuntimeError, match="ModelRunner.initialize hook did not run"):
        runner_of(object())


# ----------------------------------------------------------------------------- per step


def _counter(server: SimulatedServer, index: int) -> int:
    return int(runner_of(server.runner).state.counters[index])


def test_each_live_forward_runs_each_kernel_once_and_writes_clean_records() -> None:
    server = _server(page_size=4)
    first = SimulatedRequest(rid="a", prompt=list(range(10, 19)), max_new_tokens=4)
    second = SimulatedRequest(rid="b", prompt=list(range(30, 33)), max_new_tokens=4)
    server.admit(first)
    server.admit(second)
    server.extend([(first, 5), (second, 3)])  # chunked first
    server.extend([(first, 4)], decoding=[second])  # mixed
    server.decode([first, second], padded_rows=1)
    for kind in (CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY, CheckKind.WRITE):
        assert _counter(server, COUNTER_KERNEL_RUNS + kind) == 3
    assert _counter(server, COUNTER_STEP) == 3
    assert _counter(server, COUNTER_VIOLATIONS) == 0


def _idle_batch(server: SimulatedServer) -> ForwardBatch:
    idle = _decode_batch(req_pool_indices=[], seq_lens=[])
    idle.forward_mode = ForwardMode.IDLE
    idle.token_to_kv_pool = server.kv_pool
    return idle


def test_idle_forward_runs_no_kernel_and_is_not_live() -> None:
    server = _server()
    server.forward(_idle_batch(server))  # 0 launches is what an IDLE forward must have
    assert _counter(server, COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY) == 0
    assert _counter(server, COUNTER_STEP) == 0
    request = SimulatedRequest(rid="r", prompt=[5, 6], max_new_tokens=2)
    server.admit(request)
    server.extend([(request, 2)])
    assert _counter(server, COUNTER_STEP) == 1  # the first live forward is step 1


def test_unsupported_mode_is_refused_before_the_forward_runs() -> None:
    server = _server()
    ran = []
    batch = _decode_batch(req_pool_indices=[1], seq_lens=[2])
    batch.forward_mode = ForwardMode.SPLIT_PREFILL
    with pytest.raises(UnsupportedForwardModeError):
        around_forward(lambda *a: ran.append(a), server.runner, batch)
    assert ran == []


def test_nested_model_forward_runs_the_canary_once() -> None:
    server = _server()
    inner = server.runner.model.forward.original

    def outer(input_ids, positions, forward_batch, *, nested=True):
        if nested:  # a VLM calling a (wrapped) forward again
            return server.runner.model.forward(input_ids, positions, forward_batch, nested=False)
        return inner(input_ids, positions, forward_batch)

    server.runner.model.forward.original = outer
    request = SimulatedRequest(rid="r", prompt=[5, 6, 7], max_new_tokens=2)
    server.admit(request)
    server.extend([(request, 3)])
    assert _counter(server, COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY) == 1
    assert _counter(server, COUNTER_KERNEL_RUNS + CheckKind.WRITE) == 1


def test_faults_are_undone_even_when_the_forward_raises() -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, perturb=PerturbConfig(
        warmup_steps=0, seed=3, req_to_token_prob=1.0))
    server = _server(config=config)
    requests = [SimulatedRequest(rid=f"r{i}", prompt=[1, 2, 3, 4], max_new_tokens=9)
                for i in range(2)]
    for request in requests:
        server.admit(request)
    server.extend([(r, 4) for r in requests])
    before = server.req_to_token_pool.req_to_token.clone()
    batch = _decode_batch(req_pool_indices=[r.req_pool_idx for r in requests], seq_lens=[5, 5])
    runner_of(server.runner).on_init_new(  # what the ForwardBatch.init_new adapter does
        forward_batch=batch,
        worker_batch=SimulatedWorkerBatch(reqs=requests, seq_lens_cpu=batch.seq_lens_cpu),
    )

    def failing_forward(*args):
        assert not torch.equal(server.req_to_token_pool.req_to_token, before)  # injected
        raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        around_forward(failing_forward, server.runner, batch)
    assert torch.equal(server.req_to_token_pool.req_to_token, before)


def test_serving_start_zeroes_the_counters() -> None:
    server = _server()
    request = SimulatedRequest(rid="r", prompt=[5, 6], max_new_tokens=2)
    server.admit(request)
    server.extend([(request, 2)])
    runner = runner_of(server.runner)
    assert int(runner.state.counters.sum()) > 0
    runner.on_serving_start()
    assert int(runner.state.counters.abs().sum()) == 0


# ----------------------------------------------------------------------------- launch accounting


def _two_requests(server: SimulatedServer) -> list[SimulatedRequest]:
    requests = [SimulatedRequest(rid=f"r{i}", prompt=[1, 2, 3], max_new_tokens=4)
                for i in range(2)]
    for request in requests:
        server.admit(request)
    return requests


def test_a_live_forward_without_the_model_wrapper_fails_the_health_check() -> None:
    """The wrapper on ``model.forward`` removed (a model replaced at run time): the forward
    enqueues no canary launch, and the runner raises at once, in log mode too."""
    server = _server()
    requests = _two_requests(server)
    server.extend([(r, 3) for r in requests])
    uninstall_model_forward(server.runner.model)
    with pytest.raises(CanaryHealthError, match="ran the canary launches 0 times, expected 1"):
        server.decode(requests)


def test_a_forward_that_launches_twice_fails_the_health_check() -> None:
    def model_called_twice(model_runner: SimulatedModelRunner, batch: ForwardBatch) -> object:
        model_runner.model.forward(batch.input_ids, batch.positions, batch)
        return model_runner.model.forward(batch.input_ids, batch.positions, batch)

    server = _server(
        forward=lambda batch: around_forward(model_called_twice, server.runner, batch)
    )
    requests = _two_requests(server)
    with pytest.raises(CanaryHealthError, match="ran the canary launches 2 times, expected 1"):
        server.extend([(r, 3) for r in requests])


def test_an_idle_forward_without_a_launch_is_fine_even_without_the_wrapper() -> None:
    server = _server()
    uninstall_model_forward(server.runner.model)
    server.forward(_idle_batch(server))
    server.forward(_idle_batch(server))


# ----------------------------------------------------------------------------- graph hooks


def _decode_buffers(max_bs: int) -> DecodeInputBuffers:
    return DecodeInputBuffers.create(
        device="cpu", max_bs=max_bs, max_num_token=max_bs, hidden_size=8, vocab_size=16,
        dtype=torch.float32, dp_size=1, pp_size=1, is_encoder_decoder=False,
        require_mlp_tp_gather=False, seq_len_fill_value=1, encoder_len_fill_value=0,
        num_tokens_per_bs=1, cache_loc_dtype=torch.int64, enable_mamba_track=False,
    )


def _populate(buffers: DecodeInputBuffers, *, req_pool_indices: list[int], bs: int,
              with_fix: bool) -> None:
    raw_bs = len(req_pool_indices)
    kwargs = dict(
        forward_batch=_decode_batch(req_pool_indices=req_pool_indices, seq_lens=[4] * raw_bs),
        raw_bs=raw_bs, raw_num_token=raw_bs, bs=bs, seq_len_fill_value=1,
        require_gathered_buffer=False, num_tokens_per_bs=1, nsa_enable_prefill_cp=False,
        enable_num_token_non_padded_flag=False,
    )
    if with_fix:
        before_populate_buffers(buffers, **kwargs)
    buffers.populate_from_forward_batch(**kwargs)


@pytest.mark.parametrize("with_fix", [False, True])
def test_padded_graph_rows_point_at_request_row_zero_only_with_the_fix(with_fix: bool) -> None:
    buffers = _decode_buffers(4)
    _populate(buffers, req_pool_indices=[5, 6, 7, 8], bs=4, with_fix=with_fix)
    _populate(buffers, req_pool_indices=[1, 2], bs=4, with_fix=with_fix)
    expected = [1, 2, 0, 0] if with_fix else [1, 2, 7, 8]  # 0.5.12 leaves stale rows
    assert buffers.req_pool_indices.tolist() == expected
    assert buffers.out_cache_loc[2:].tolist() == [0, 0]


def test_capture_starts_from_padding_rows_only() -> None:
    buffers = _decode_buffers(4)
    _populate(buffers, req_pool_indices=[5, 6, 7, 8], bs=4, with_fix=True)
    # the attributes of CudaGraphRunner that CudaGraphRunner.capture's adapter reads
    graph_runner = SimpleNamespace(buffers=buffers, model_runner=_server().runner)
    before_capture(graph_runner)
    assert buffers.req_pool_indices.tolist() == [0] * 4
    assert buffers.out_cache_loc.tolist() == [0] * 4


# ----------------------------------------------------------------------------- memory budget


def test_memory_budget_hooks() -> None:
    def runner(**server_args) -> SimpleNamespace:
        return SimpleNamespace(server_args=SimpleNamespace(
            **{"speculative_algorithm": None, "enable_hierarchical_cache": False,
               **server_args}))

    cell_size = add_record_bytes_to_cell_size(4096, object(), runner(), 4)
    assert cell_size == 4096 + RECORD_BYTES
    eagle = runner(speculative_algorithm="EAGLE")
    assert add_record_bytes_to_cell_size(4096, object(), eagle, 4) == 4096 + 2 * RECORD_BYTES
    # the hierarchical cache's host records: 40 B per host slot, hicache_ratio slots per token
    hicache = runner(enable_hierarchical_cache=True, hicache_ratio=4.0)
    assert add_record_bytes_to_cell_size(4096, object(), hicache, 4) == 4096 + RECORD_BYTES + 160

    model_runner = SimpleNamespace(  # what the budget reads of a ModelRunner, before the pools
        device="cpu", page_size=4, dp_size=1,
        server_args=SimulatedServerArgs(max_running_requests=7),
        model_config=SimpleNamespace(context_len=60),
    )
    attach_canary_runner(
        model_runner=model_runner,
        runner=CanaryRunner(config=CanaryConfig(mode=CanaryMode.LOG, ring_capacity=100),
                            model_runner=model_runner, kernels=_KERNELS),
    )
    available = reserve_fixed_bytes(10**9, model_runner, 0)
    expected = fixed_buffers(
        page_size=4, ring_capacity=100, request_rows=8, context_columns=64, token_history=False,
        write_expectation_tokens=0, graph_max_bs=0, graph_request_ids=False,
    )
    assert available == 10**9 - expected.total
    # padding records, ring (11 fields per row), counters (13, with the publication count and
    # its checksum), owner chains (8 rows), the live row count and the seq_lens mirror (8 rows:
    # no graphs), upload staging
    assert expected.total == (
        4 * 32 + 100 * 11 * 8 + 13 * 8 + 8 * 8 + (1 + 8) * 8 + UPLOAD_STAGING_WORDS * 8
    )


def test_hooks_apply_to_sglang_and_fix_padded_rows_through_the_registry() -> None:
    """In a fresh interpreter: register the canary's hooks, apply them to SGLang's classes, check
    each is in place, and drive the patched ``populate_from_forward_batch``."""
    code = textwrap.dedent("""
        import torch
        from sglang.srt.kv_canary import hook_targets
        from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
        from sglang.srt.kv_canary.hook_registration import register_hooks, verify_hooks_applied
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang.srt.model_executor.cuda_graph_runner import DecodeInputBuffers
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        # the scheduler and the hierarchical cache import CUDA libraries: their hooks are
        # checked statically
        cuda_only = (".managers.scheduler.", ".memory_pool_host.", ".cache_controller.",
                     ".hiradix_cache.")
        hook_targets.HOOK_SPECS = tuple(
            s for s in hook_targets.HOOK_SPECS if not any(m in s.target for m in cuda_only))
        config = CanaryConfig(mode=CanaryMode.LOG)
        specs = register_hooks(config)
        HookRegistry.apply_hooks()
        verify_hooks_applied(config)
        buffers = DecodeInputBuffers.create(
            device="cpu", max_bs=4, max_num_token=4, hidden_size=8, vocab_size=16,
            dtype=torch.float32, dp_size=1, pp_size=1, is_encoder_decoder=False,
            require_mlp_tp_gather=False, seq_len_fill_value=1, encoder_len_fill_value=0,
            num_tokens_per_bs=1, cache_loc_dtype=torch.int64, enable_mamba_track=False)
        buffers.req_pool_indices.copy_(torch.tensor([5, 6, 7, 8]))
        batch = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=1,
            input_ids=torch.tensor([3]), req_pool_indices=torch.tensor([1]),
            seq_lens=torch.tensor([4]), out_cache_loc=torch.tensor([9]), seq_lens_sum=4,
            positions=torch.tensor([3]))
        buffers.populate_from_forward_batch(forward_batch=batch, raw_bs=1, raw_num_token=1,
            bs=4, seq_len_fill_value=1, require_gathered_buffer=False, num_tokens_per_bs=1,
            nsa_enable_prefill_cp=False, enable_num_token_non_padded_flag=False)
        print(len(specs), buffers.req_pool_indices.tolist())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].endswith("[1, 0, 0, 0]")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
