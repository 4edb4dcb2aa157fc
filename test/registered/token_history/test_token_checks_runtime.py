"""The token checks wired into the model runner's canary, on CPU against SGLang's own objects.

* The ``ForwardBatch.init_new`` adapter: an extend batch's carrier holds the request-row updates
  (new owners' histories only with a token check on) and, write-input assert on, its requests; on real ForwardBatch objects made by the real
  ``init_new``; applied by SGLang's HookRegistry to the real classmethod (``batch`` as a keyword
  too).
* ``run_forward`` uploads a new owner's history (after the model is enqueued, before the post
  launch); every sampled token is appended on the device after ``ModelRunner.sample`` (a
  chunk's discarded sample never), a decode step reads no request, and the in-forward part
  (what graph capture records and replays) reads only the persistent history tensors, never a
  batch's own carrier.
* Verify-token reports a slot holding a token the request never had; the write-input assert
  compares prompt tokens with the request's tokens sent with the batch and generated tokens
  (also in MIXED batches) with the oracle; the history alone (verify-token off) is only the
  write fallback.
* Start-up forwards without request ids, the eager overflow buffer, the EAGLE draft-decode
  switch, the memory reservation and the start-up line.
"""

import dataclasses
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _token_check_batches import (
    KERNELS,
    model_worker_batch,
    prepare_for_init_new,
    run_hooked,
    sglang_reqs,
    token_check_server,
    token_config,
)

from sglang.jit_kernel.kv_canary.consts import (
    COUNTER_VIOLATIONS,
    FIELD_TOKEN_POSITION,
    NUM_COUNTERS,
    RECORD_BYTES,
    RING_ROW_FIELDS,
    CheckKind,
    Reason,
)
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.hook_targets import select_hook_specs
from sglang.srt.kv_canary.hooks.forward_batch import after_init_new
from sglang.srt.kv_canary.hooks.model_runner import reserve_fixed_bytes
from sglang.srt.kv_canary.monitor.violations import find_violation_rows
from sglang.srt.kv_canary.batch.carrier import (
    CanaryBatchInputs,
    attach_batch_inputs,
    batch_inputs_of,
)
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner, attach_canary_runner
from sglang.srt.kv_canary.runner.request_rows import UNKNOWN_OWNER_CHAIN, RowUpdates
from sglang.srt.kv_canary.runner.kernels import CanaryKernels
from sglang.srt.kv_canary.runner.memory_budget import (
    UPLOAD_STAGING_WORDS,
    context_columns_bound,
    max_tokens_per_forward,
    request_rows_bound,
)
from sglang.srt.kv_canary.selfcheck.simulation import (
    VOCAB_SIZE,
    SimulatedRequest,
    ServerHooks,
    SimulatedServer,
)
from sglang.srt.kv_canary.token_history.write_expectations import (
    WriteExpectations,
    extend_expectations_on_host,
    write_input_assert_applies,
)
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle, hash_oracle_token_scalar
from sglang.srt.kv_canary.token_oracle.request_ids import (
    MissingRequestIdsError,
    stable_hash_str_to_i64,
)
from sglang.srt.model_executor import forward_batch_info
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="kv-canary-cpu")

_FB_INIT_NEW = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"


def _oracle_token(req, position: int) -> int:
    """The oracle's token of a request without a bootstrap room at ``position``."""
    return hash_oracle_token_scalar(generalized_req_id=stable_hash_str_to_i64(req.rid),
                                    position=position, vocab_size=VOCAB_SIZE)


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 131 + 7 * i) % VOCAB_SIZE for i in range(length)]


def _request(server: SimulatedServer, rid: str, prompt: list[int],
             max_new_tokens: int = 8) -> SimulatedRequest:
    request = SimulatedRequest(rid=rid, prompt=prompt, max_new_tokens=max_new_tokens)
    server.admit(request)
    return request


@pytest.fixture
def caplog_canary(caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    return caplog


def _rows(caplog) -> list:
    return find_violation_rows("\n".join(caplog.messages))


def _poll(runner: CanaryRunner) -> None:
    runner.monitor.poll()


# ----------------------------------------------------------------------------- the init_new hook


def _real_forward_batch(server, reqs, *, mode, prefix_lens=None, monkeypatch) -> ForwardBatch:
    """The real ``ForwardBatch.init_new`` followed by the adapter, as the hooked classmethod
    runs."""
    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda: False)
    runner = prepare_for_init_new(server.runner)
    batch = model_worker_batch(mode=mode, reqs=reqs, extend_prefix_lens=prefix_lens)
    forward_batch = ForwardBatch.init_new(batch, runner)
    after_init_new(forward_batch, ForwardBatch, batch=batch, model_runner=runner)
    return forward_batch


@pytest.mark.parametrize(
    "changes, history",
    [
        ({}, False),
        ({"enable_verify_token_assert": True}, True),
        ({"enable_write_input_assert": True, "enable_token_oracle": True}, True),
    ],
)
def test_the_carrier_holds_histories_only_with_a_token_check(changes, history,
                                                             monkeypatch) -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, **changes)
    (spec,) = [s for s in select_hook_specs(config) if s.target == _FB_INIT_NEW]
    assert spec.hook_type == "after"
    assert not [s for s in select_hook_specs(CanaryConfig()) if s.target == _FB_INIT_NEW]
    server, _ = token_check_server(config)
    forward_batch = _real_forward_batch(server, sglang_reqs([[5, 6, 7]]), mode=ForwardMode.EXTEND,
                                        prefix_lens=[0], monkeypatch=monkeypatch)
    inputs = batch_inputs_of(forward_batch)
    # An extend batch with a new owner carries row updates (its owner chain is always sent);
    # the token history rides along only with a token check.
    updates = inputs.row_updates
    assert updates is not None
    sections = updates.host_sections
    assert sections.owners is not None and sections.owners.rows.tolist() == [1]
    assert (sections.history is not None) is history
    assert hasattr(forward_batch, "req_all_ids_flat") is history


def test_init_new_hook_snapshots_real_forward_batches(monkeypatch) -> None:
    server, runner = token_check_server(token_config())
    reqs = sglang_reqs([[5, 6, 7], [8, 9]], outputs=[[], [10]])
    extend = _real_forward_batch(server, reqs, mode=ForwardMode.EXTEND, prefix_lens=[0, 1],
                                 monkeypatch=monkeypatch)
    inputs = batch_inputs_of(extend)
    history = inputs.row_updates.host_sections.history
    owners = inputs.row_updates.host_sections.owners
    # Both rows have new owners: before the forward the device only forgets each row's previous
    # owner (known length 0, chain unknown); their tokens are read once the model is enqueued.
    assert history.req_pool_indices.tolist() == [1, 2]
    assert history.req_all_ids_lens.tolist() == [0, 0]
    assert history.req_all_ids_flat.tolist() == []
    assert owners.rows.tolist() == [1, 2]
    assert owners.values.tolist() == [UNKNOWN_OWNER_CHAIN] * 2
    for public, section in ((extend.req_all_ids_flat, history.req_all_ids_flat),
                            (extend.req_all_ids_lens, history.req_all_ids_lens)):
        # the public views: the same words of the host upload buffer as the sections
        assert public.data_ptr() == section.data_ptr() and torch.equal(public, section)
    assert [d.row for d in inputs.row_updates.deferred] == [1, 2]
    # kept for the expectations, built after the model is enqueued
    assert [id(req) for req in inputs.extend_reqs] == [id(req) for req in reqs]
    deferred = runner.request_rows.prepare_deferred(inputs.row_updates.deferred)
    late = deferred.host_sections
    assert late.history.req_all_ids_lens.tolist() == [3, 3]
    assert late.history.req_all_ids_flat.tolist() == [5, 6, 7, 8, 9, 10]
    assert [(row, tokens.tolist()) for row, tokens in deferred.read_whole] == [
        (1, [5, 6, 7]), (2, [8, 9, 10])]
    # a's seed is the anchor (no cached prefix): only b's prefix is checked
    assert late.admissions.rows.tolist() == [2]
    assert late.admissions.prefix_lens.tolist() == [1]
    # the write-input assert's expectations: a's prompt tokens at positions 0-2, b's at 1, and
    # at b's generated position 2 the oracle's token (its input was b's first output)
    tokens, positions = runner.token_checks.post_expectations(extend, inputs=inputs,
                                                              admitted=deferred)
    assert positions.tolist() == [0, 1, 2, 1, 2]
    assert tokens.tolist() == [5, 6, 7, 9, _oracle_token(reqs[1], 2)]

    # what the uploads before the forward and after the model's enqueue do
    runner.request_rows.commit(inputs.row_updates)
    runner.request_rows.commit(deferred)
    reqs[0].output_ids.append(11)
    decode = _real_forward_batch(server, reqs, mode=ForwardMode.DECODE, monkeypatch=monkeypatch)
    inputs = batch_inputs_of(decode)
    # a decode step reads no request: its tokens are appended on the device after sampling
    assert inputs.row_updates is None and not hasattr(decode, "req_all_ids_flat")
    assert inputs.extend_reqs is None  # decode rows: the oracle decides, in the forward


def test_without_the_write_input_assert_no_expectations_are_attached(monkeypatch) -> None:
    server, _ = token_check_server(token_config(write_input=False))
    extend = _real_forward_batch(server, sglang_reqs([[5, 6, 7]]), mode=ForwardMode.EXTEND,
                                 prefix_lens=[0], monkeypatch=monkeypatch)
    inputs = batch_inputs_of(extend)
    assert extend.req_all_ids_flat.tolist() == []  # a new owner: deferred
    deferred = server.runner.kv_canary.request_rows.prepare_deferred(inputs.row_updates.deferred)
    assert deferred.host_sections.history.req_all_ids_flat.tolist() == [5, 6, 7]
    assert inputs.extend_reqs is None


def test_init_new_hook_refuses_a_batch_without_one_request_per_row() -> None:
    server, _ = token_check_server(token_config())
    batch = SimpleNamespace(reqs=sglang_reqs([[1, 2]]))
    forward_batch = SimpleNamespace(batch_size=2, forward_mode=ForwardMode.DECODE)
    with pytest.raises(ValueError, match="2 rows but 1 requests"):
        after_init_new(forward_batch, ForwardBatch, batch, server.runner)
    batch.reqs = None
    with pytest.raises(ValueError, match="2 rows but no requests"):
        after_init_new(forward_batch, ForwardBatch, batch, server.runner)


def test_init_new_hook_on_a_runner_without_its_canary_is_an_installation_error() -> None:
    server = SimulatedServer(page_size=1, num_pages=16, max_requests=2, max_context_len=16,
                             forward=lambda batch: None)
    with pytest.raises(RuntimeError, match="ModelRunner.initialize hook did not run"):
        after_init_new(SimpleNamespace(batch_size=0), ForwardBatch, SimpleNamespace(reqs=[]),
                       server.runner)


def test_hook_registry_applies_the_hook_to_the_real_classmethod() -> None:
    """In a fresh interpreter: the hook table's init_new hooks, applied by SGLang's registry to
    ``ForwardBatch.init_new`` (a classmethod), run on a real call with keyword arguments."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _token_check_batches import (model_worker_batch, prepare_for_init_new,
                                          sglang_reqs, token_check_server, token_config)
        from sglang.srt.kv_canary import hook_targets
        from sglang.srt.kv_canary.hook_registration import register_hooks, verify_hooks_applied
        from sglang.srt.kv_canary.batch.carrier import batch_inputs_of
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang.srt.model_executor import forward_batch_info
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        config = token_config()
        hook_targets.HOOK_SPECS = tuple(s for s in hook_targets.HOOK_SPECS
                                        if s.target.endswith("ForwardBatch.init_new"))
        register_hooks(config)
        HookRegistry.apply_hooks()
        verify_hooks_applied(config)
        forward_batch_info.enable_num_token_non_padded = lambda: False
        server, _ = token_check_server(config)
        runner = prepare_for_init_new(server.runner)
        batch = model_worker_batch(mode=ForwardMode.EXTEND, reqs=sglang_reqs([[4, 5, 6]]),
                                   extend_prefix_lens=[0])
        forward_batch = ForwardBatch.init_new(batch=batch, model_runner=runner)
        inputs = batch_inputs_of(forward_batch)
        print(inputs.extend_reqs[0].origin_input_ids, [d.row for d in inputs.row_updates.deferred],
              forward_batch.rids_int.shape[0])
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[4, 5, 6] [1] 1"


def test_hook_registry_applies_the_sample_hook_to_the_real_method() -> None:
    """In a fresh interpreter: the hook table's ``ModelRunner.sample`` hook, applied by SGLang's
    registry to the real method, receives its positional arguments and result, and appends the
    sampled token to the row's history on the device."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import torch
        from _token_check_batches import token_check_server, token_config
        from sglang.srt.kv_canary import hook_targets
        from sglang.srt.kv_canary.hook_registration import register_hooks, verify_hooks_applied
        from sglang.srt.kv_canary.selfcheck.simulation import SimulatedRequest
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.plugins.hook_registry import HookRegistry
        config = token_config(write_input=False)
        server, runner = token_check_server(config)
        request = SimulatedRequest(rid="a", prompt=[4, 5, 6], max_new_tokens=4)
        server.admit(request)
        server.extend([(request, 3)])  # the simulator calls the prefill's sample hook itself
        row = request.req_pool_idx
        hook_targets.HOOK_SPECS = tuple(s for s in hook_targets.HOOK_SPECS
                                        if s.target.endswith("ModelRunner.sample"))
        register_hooks(config)
        HookRegistry.apply_hooks()
        verify_hooks_applied(config)
        model_runner = server.runner  # what the unpatched body of ModelRunner.sample calls
        model_runner._preprocess_logits = lambda logits_output, sampling_info: None
        model_runner.sampler = lambda *args: torch.tensor([77])
        model_runner.maybe_update_ngram_token_table = lambda next_token_ids, forward_batch: None
        decode = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=1,
            input_ids=torch.tensor([request.tokens[-1]]), req_pool_indices=torch.tensor([row]),
            seq_lens=torch.tensor([4]), out_cache_loc=torch.tensor([0]), seq_lens_sum=4,
            positions=torch.tensor([3]))
        tokens = ModelRunner.sample(model_runner, None, decode)
        history = runner.token_checks.history
        print(tokens.tolist(), history.lens[row].item(), history.tokens[row, :5].tolist())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("[77] 5 [4, 5, 6, "), line
    assert line.endswith(", 77]"), line


# ----------------------------------------------------------------------------- before the forward


def test_run_forward_refreshes_the_history_before_the_forward() -> None:
    """A continuing row's tokens are on the device before the model forward; a new owner's
    (deferred admission: a fresh prompt, or a chunk of one) arrive after the model is enqueued,
    before the post launch, which checks the written inputs."""
    seen = []
    post_saw = []

    def recording_post_forward(*, state, batch):
        post_saw.append(batch.token_history_lens.tolist())
        KERNELS.post_forward(state=state, batch=batch)

    server, runner = token_check_server(
        token_config(), kernels=dataclasses.replace(KERNELS, post_forward=recording_post_forward))
    history = runner.token_checks.history
    wrapper = server.runner.model.forward
    model_forward = wrapper.original

    def recording_model_forward(input_ids, positions, forward_batch):
        seen.append(history.lens.tolist())  # what the model's forward finds
        return model_forward(input_ids, positions, forward_batch)

    wrapper.original = recording_model_forward
    first = _request(server, "a", _prompt(1, 5))
    server.extend([(first, 5)])
    assert seen[-1][first.req_pool_idx] == 0  # a new owner: not before the model
    assert post_saw[-1][first.req_pool_idx] == 5  # but before the post launch
    server.decode([first])
    assert seen[-1][first.req_pool_idx] == 6  # the first output token, sampled at prefill
    # and after the decode step its own sample too (appended on the device)
    assert history.tokens[first.req_pool_idx, :8].tolist() == first.tokens[:7] + [0]
    chunked = _request(server, "b", _prompt(40, 8))
    server.extend([(chunked, 3)])
    assert seen[-1][chunked.req_pool_idx] == 0  # a new owner written in part: the same
    assert post_saw[-1][chunked.req_pool_idx] == 8


def test_an_extend_forwards_expectations_reach_the_post_launch_only() -> None:
    """An eager EXTEND / MIXED forward: the pre launch's view carries no write-input
    expectations (the pre launch does not check an extend layout's inputs); they are built once
    the model forward is enqueued and go to the post launch, which compares them. A decode
    forward's (computed in the forward) go to the pre launch."""
    events = []

    def recording_model_forward(input_ids, positions, forward_batch):
        events.append("model")
        return model_forward(input_ids, positions, forward_batch)

    def launch(name, kernel):
        def recorded(*, state, batch):
            events.append((name, None if batch.expected_input_ids is None
                           else batch.expected_input_ids.tolist()))
            kernel(state=state, batch=batch)
        return recorded

    server, runner = token_check_server(token_config(), kernels=dataclasses.replace(
        KERNELS, pre_forward=launch("pre", KERNELS.pre_forward),
        post_forward=launch("post", KERNELS.post_forward)))
    wrapper = server.runner.model.forward
    model_forward = wrapper.original
    wrapper.original = recording_model_forward
    a, b = _request(server, "a", _prompt(3, 4)), _request(server, "b", _prompt(4, 6))
    server.extend([(a, 4)])
    assert events == [("pre", None), "model", ("post", a.tokens[:4])]
    events.clear()
    server.extend([(b, 6)], decoding=[a])  # MIXED: a's first output rides along
    assert events == [("pre", None), "model", ("post", b.tokens[:6] + [a.tokens[4]])]
    events.clear()
    server.decode([a, b])
    assert events[0] == ("pre", [a.tokens[5], b.tokens[6]]) and events[2][0] == "post"


def _recording(kernels: CanaryKernels, views: list) -> CanaryKernels:
    """``kernels`` whose pre-forward launch also records the batch view it is given."""

    def pre_forward(*, state, batch):
        views.append(batch)
        kernels.pre_forward(state=state, batch=batch)

    return dataclasses.replace(kernels, pre_forward=pre_forward)


def test_the_in_forward_part_never_refreshes_the_history_from_the_batch() -> None:
    """What graph capture records (and replays) is the wrapped ``model.forward``: it reads the
    persistent history tensors and never the batch's own row updates (a decode step's append
    applies only what ``run_forward`` uploaded: here nothing)."""
    views = []
    server, runner = token_check_server(token_config(write_input=False),
                                        kernels=_recording(KERNELS, views))
    request = _request(server, "a", _prompt(2, 6))
    server.extend([(request, 6)])
    history = runner.token_checks.history
    before = (history.tokens.clone(), history.lens.clone())
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=1,
        input_ids=torch.tensor([request.tokens[-1]]),
        req_pool_indices=torch.tensor([request.req_pool_idx]),
        seq_lens=torch.tensor([7]), out_cache_loc=torch.tensor([0]), seq_lens_sum=7,
        positions=torch.tensor([6]), token_to_kv_pool=server.kv_pool,
    )
    request.retraction_count += 1  # a new owner of the same row: its whole history to send
    updates = runner.request_rows.prepare(reqs=[request], prefix_lens=[6], seq_lens=[7])
    assert updates.host_sections.history.req_all_ids_flat.tolist() == request.tokens
    attach_batch_inputs(batch, CanaryBatchInputs(runner=runner, row_updates=updates))
    server.runner.model.forward(batch.input_ids, batch.positions, batch)  # never uploaded
    assert torch.equal(history.tokens, before[0])
    assert torch.equal(history.lens, before[1])
    view = views[-1]
    assert view.token_history.data_ptr() == history.tokens.data_ptr()
    assert view.token_history_lens.data_ptr() == history.lens.data_ptr()
    assert view.verify_token and view.expected_input_ids is None


def _counting(kernels: CanaryKernels, calls: dict[str, int]) -> CanaryKernels:
    """``kernels`` whose history scatter and append count their calls in ``calls``."""

    def counted(name: str, launch):
        def launch_and_count(**kwargs):
            calls[name] = calls.get(name, 0) + 1
            launch(**kwargs)

        return launch_and_count

    return dataclasses.replace(
        kernels,
        scatter_req_token_ids=counted("scatter", kernels.scatter_req_token_ids),
        bind_append_history_tokens=lambda **bound: counted(
            "append", kernels.bind_append_history_tokens(**bound)),
    )


def test_sampled_tokens_are_appended_on_the_device_and_new_owners_scattered() -> None:
    """Each sampled forward appends its rows' tokens with one launch after the sample; the host
    scatters only new owners' histories (a reset before the model, the whole history after it);
    a decode step sends nothing from the host. The history stays exact: every token, the last
    sampled one included."""
    calls: dict[str, int] = {}
    server, runner = token_check_server(token_config(write_input=False),
                                        kernels=_counting(KERNELS, calls))
    assert calls == {"scatter": 1, "append": 1}  # compiled at serving start, on padding row 0
    assert not runner.token_checks.history.lens.any()  # which stays empty
    calls.clear()
    history = runner.token_checks.history
    a, b = _request(server, "a", _prompt(1, 6)), _request(server, "b", _prompt(2, 5))
    server.extend([(a, 6), (b, 5)])
    assert calls == {"scatter": 2, "append": 1}

    def assert_exact(*requests: SimulatedRequest) -> None:
        for r in requests:
            assert history.lens[r.req_pool_idx].item() == len(r.tokens)
            assert history.tokens[r.req_pool_idx, : len(r.tokens)].tolist() == r.tokens

    assert_exact(a, b)
    for step in range(1, 5):
        server.decode([a, b])
        assert calls == {"scatter": 2, "append": 1 + step}
        assert_exact(a, b)
    c = _request(server, "c", _prompt(3, 4))
    server.extend([(c, 4)], decoding=[a, b])  # MIXED: c's whole history, a and b nothing
    assert calls == {"scatter": 4, "append": 6}
    server.decode([a, b, c])
    assert calls == {"scatter": 4, "append": 7}
    assert_exact(a, b, c)


def test_a_chunk_s_discarded_sample_never_enters_the_history() -> None:
    """A chunked prefill samples a token SGLang discards: its row already knows the prompt
    beyond that position, so the append leaves the prompt as it is."""
    server, runner = token_check_server(token_config(write_input=False))
    history = runner.token_checks.history
    request = _request(server, "long", _prompt(5, 12))
    server.extend([(request, 4)])
    server.extend([(request, 4)])
    assert history.lens[request.req_pool_idx].item() == 12
    assert history.tokens[request.req_pool_idx, :12].tolist() == request.prompt
    server.extend([(request, 4)])  # the last chunk: its sample is the first output
    assert request.output and history.lens[request.req_pool_idx].item() == 13
    assert history.tokens[request.req_pool_idx, :13].tolist() == request.tokens


def test_a_decode_step_reads_no_request(monkeypatch) -> None:
    """The steady decode step's host work touches no request: ``RequestRows.prepare`` is not
    called."""
    from sglang.srt.kv_canary.runner.request_rows import RequestRows

    server, runner = token_check_server(token_config())
    requests = [_request(server, f"r{i}", _prompt(i, 5)) for i in range(3)]
    server.extend([(r, 5) for r in requests])

    def no_prepare(*args, **kwargs):
        raise AssertionError("a decode step prepared row updates")

    monkeypatch.setattr(RequestRows, "prepare", no_prepare)
    for _ in range(3):
        server.decode(requests)
    assert int(runner.state.counters[COUNTER_VIOLATIONS]) == 0


def test_a_token_consumed_other_than_the_one_sampled_is_caught_without_the_oracle(
        caplog_canary) -> None:
    """The scheduler feeds a decode row another token than the sampler produced (the history
    holds the sampled one, appended on the device): verify-token reports the slot, with no
    oracle and no write-input assert."""
    server, runner = token_check_server(token_config(write_input=False))
    request = _request(server, "a", _prompt(6, 5))
    server.extend([(request, 5)])
    sampled = request.output[-1]
    request.output[-1] = (sampled + 1) % VOCAB_SIZE  # what the next forward will consume
    server.decode([request])
    server.decode([request])
    _poll(runner)
    rows = _rows(caplog_canary)
    assert rows and all(r.position == 5 and r.reasons == Reason.VERIFY_TOKEN
                        and r.expected_token == sampled for r in rows)


def test_a_live_batch_without_row_updates_fails_loudly() -> None:
    server, _ = token_check_server(token_config(write_input=False), forward=None)
    server.hooks = ServerHooks()  # the init_new hook "did not run"
    request = _request(server, "a", _prompt(3, 4))
    with pytest.raises(RuntimeError, match="carries no canary inputs"):
        server.extend([(request, 4)])


def test_an_upload_larger_than_the_staging_area_is_sent_in_full() -> None:
    """A history larger than the preallocated staging (a very long admitted prompt) is uploaded
    in full: its length is known, the tokens that fit the row are there, and the seq_lens
    mirror holds the batch's seq_lens."""
    server, runner = token_check_server(token_config(write_input=False))
    prompt = _prompt(9, UPLOAD_STAGING_WORDS + 10)
    request = _request(server, "long", prompt)
    server.extend([(request, 4)])  # the first chunk of a chunked prefill
    history = runner.token_checks.history
    width = history.tokens.shape[1]
    assert history.lens[request.req_pool_idx].item() == len(prompt)
    assert history.tokens[request.req_pool_idx].tolist() == prompt[:width]
    assert runner.uploader.seq_lens_mirror[:1].tolist() == [4]


# ----------------------------------------------------------------------------- the checks


def test_verify_token_reports_a_slot_holding_a_token_the_request_never_had(caplog_canary) -> None:
    server, runner = token_check_server(token_config(write_input=False))
    request = _request(server, "a", _prompt(4, 9))
    server.extend([(request, 9)])
    server.decode([request])
    slot = int(server.req_to_token_pool.req_to_token[request.req_pool_idx, 3])
    runner.state.records[slot, FIELD_TOKEN_POSITION] += 1
    server.decode([request])
    _poll(runner)
    rows = [r for r in _rows(caplog_canary) if r.position == 3]
    assert {r.check for r in rows} == {CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY}
    assert all(r.reasons & Reason.VERIFY_TOKEN and r.expected_token == request.prompt[3]
               for r in rows)


def _corrupting_forward(*, mode: ForwardMode, token_index: int, value: int):
    """A forward hook that feeds ``value`` as token ``token_index`` of the first batch of
    ``mode`` (before the canary sees the batch)."""
    done = []

    def forward(server, batch):
        if batch.forward_mode == mode and not done:
            batch.input_ids[token_index] = value
            done.append(True)
        return run_hooked(server, batch)

    return forward


def test_write_input_compares_prompt_tokens_with_the_request_s_own(caplog_canary) -> None:
    prompt = _prompt(5, 7)
    server, runner = token_check_server(
        token_config(), forward=_corrupting_forward(mode=ForwardMode.EXTEND, token_index=4,
                                                    value=(prompt[4] + 1) % VOCAB_SIZE))
    request = _request(server, "a", prompt)
    server.extend([(request, 7)])
    server.decode([request])
    _poll(runner)
    write_rows = [r for r in _rows(caplog_canary) if r.check == CheckKind.WRITE]
    assert [(r.position, r.reasons, r.expected_token) for r in write_rows] == [
        (4, Reason.WRITE_TOKEN, prompt[4])
    ]
    verify_rows = [r for r in _rows(caplog_canary) if r.check != CheckKind.WRITE]
    # the post launch of the same forward (the history arrived after the model was enqueued)
    # and the next forward: the slot is wrong
    assert {r.step for r in verify_rows} == {write_rows[0].step, write_rows[0].step + 1}
    assert all(r.position == 4 and r.reasons == Reason.VERIFY_TOKEN for r in verify_rows)


def test_write_input_predicts_the_generated_tokens_of_mixed_batches(caplog_canary) -> None:
    """A decode row inside a MIXED batch consuming a token the oracle did not emit, sampled so
    (the history has it, as after a next-token swap): only the write-input assert can see it."""
    server, runner = token_check_server(token_config())
    oracle_tokens: list[int] = []
    sample = server.sampler.sample

    def swapping_sample(rows, *, step):
        tokens = sample(rows, step=step)
        if rows and rows[0][0].rid == "dec" and not oracle_tokens:
            oracle_tokens.append(tokens[0])
            tokens[0] = (tokens[0] + 1) % VOCAB_SIZE  # the sampler's exit emits another one
        return tokens

    server.sampler.sample = swapping_sample
    decoding = _request(server, "dec", _prompt(6, 5))
    server.extend([(decoding, 5)])
    chunked = _request(server, "chunk", _prompt(7, 9))
    server.extend([(chunked, 4)], decoding=[decoding])  # MIXED
    _poll(runner)
    server.decode([decoding])
    _poll(runner)
    rows = _rows(caplog_canary)
    assert [(r.check, r.position, r.reasons, r.expected_token) for r in rows] == [
        (CheckKind.WRITE, 5, Reason.WRITE_TOKEN, oracle_tokens[0])
    ]


def test_the_history_alone_is_only_the_write_fallback_when_verify_token_is_off(
        caplog_canary) -> None:
    server, runner = token_check_server(token_config(verify=False))
    request = _request(server, "a", _prompt(8, 6))
    server.extend([(request, 6)])
    slot = int(server.req_to_token_pool.req_to_token[request.req_pool_idx, 2])
    runner.state.records[slot, FIELD_TOKEN_POSITION] += 1  # would be verify_token (and chain)
    server.decode([request])
    _poll(runner)
    assert {r.reasons for r in _rows(caplog_canary)} == {Reason.VERIFY_CHAIN}


def test_write_input_assert_is_off_for_eagle_draft_decode() -> None:
    def batch(mode, draft):
        spec_info = None if draft is None else SimpleNamespace(is_draft_input=lambda: draft)
        return SimpleNamespace(forward_mode=mode, spec_info=spec_info)

    assert not write_input_assert_applies(batch(ForwardMode.DECODE, True))
    assert write_input_assert_applies(batch(ForwardMode.DECODE, False))
    assert write_input_assert_applies(batch(ForwardMode.DECODE, None))
    assert write_input_assert_applies(batch(ForwardMode.EXTEND, None))


# ----------------------------------------------------------------------------- in-forward inputs


def _write_expectations(*, capacity: int) -> WriteExpectations:
    return WriteExpectations(oracle=TokenOracleManager(oracle=HashOracle(vocab_size=VOCAB_SIZE)),
                             capacity=capacity, device=torch.device("cpu"))


def _decode_batch(rows: int) -> ForwardBatch:
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=rows,
        input_ids=torch.zeros(rows, dtype=torch.int64),
        req_pool_indices=torch.arange(1, rows + 1), seq_lens=torch.full((rows,), 5),
        out_cache_loc=torch.zeros(rows, dtype=torch.int64), seq_lens_sum=5 * rows,
        positions=torch.full((rows,), 4),
    )
    # the public id attributes: all the expectations read
    batch.rids_int = torch.arange(rows, dtype=torch.int64)
    batch.bootstrap_room_ids_int = torch.full((rows,), -1)
    return batch


def test_expectations_grow_for_large_eager_forwards_and_keep_the_graph_buffer() -> None:
    expectations = _write_expectations(capacity=4)

    def tokens(rows: int) -> torch.Tensor:
        return expectations.compute(forward_batch=_decode_batch(rows))[0]

    small, large, again = tokens(3), tokens(9), tokens(3)
    assert small.data_ptr() == again.data_ptr()  # what a captured graph holds never moves
    assert large.data_ptr() != small.data_ptr() and large.shape == (9,)
    assert tokens(7).data_ptr() == large.data_ptr()  # the overflow grows once, then is reused
    assert expectations.capacity == 4


def test_extend_expectations_are_the_ones_sent_and_cover_every_token() -> None:
    batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=torch.zeros(3, dtype=torch.int64),
        req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([3]),
        out_cache_loc=torch.zeros(3, dtype=torch.int64), seq_lens_sum=3,
        positions=torch.arange(3), extend_seq_lens=torch.tensor([3], dtype=torch.int32),
        extend_prefix_lens=torch.tensor([0], dtype=torch.int32),
    )
    batch.rids_int, batch.bootstrap_room_ids_int = torch.tensor([7]), torch.tensor([-1])
    expectations = _write_expectations(capacity=4)
    with pytest.raises(RuntimeError, match="carries no expectations"):
        expectations.compute(forward_batch=batch)
    with pytest.raises(RuntimeError, match="has 3 tokens but its expectations cover 2"):
        expectations.compute(forward_batch=batch,
                             extend_expectations=torch.zeros((2, 2), dtype=torch.int64))
    sent = torch.arange(6, dtype=torch.int64).view(2, 3)
    tokens, positions = expectations.compute(forward_batch=batch, extend_expectations=sent)
    assert tokens.tolist() == [0, 1, 2] and positions.tolist() == [3, 4, 5]
    assert tokens.data_ptr() == sent.data_ptr()  # views: no device work per extend forward


def test_a_decode_batch_padded_into_extend_keeps_the_decode_expectations() -> None:
    """DP-attention max-len padding turns a decode batch into EXTEND after ``init_new`` (which
    attached no extend expectations): its original mode decides, as in fill_expected_inputs."""
    expectations = _write_expectations(capacity=4)
    decode = expectations.compute(forward_batch=_decode_batch(3))[0].tolist()
    padded = _decode_batch(3)
    padded._original_forward_mode = ForwardMode.DECODE
    padded.forward_mode = ForwardMode.EXTEND
    assert expectations.compute(forward_batch=padded)[0].tolist() == decode


def test_host_extend_expectations_match_the_oracle_and_the_prompts() -> None:
    """Per row: positions prefix + j; the prompt's own tokens, then the oracle's for generated
    positions (a retracted request prefilled again), with the generalized id (room if valid,
    else the hashed rid); -1 past the rows (a token count larger than the rows' sum)."""
    oracle = HashOracle(vocab_size=VOCAB_SIZE)
    reqs = [SimpleNamespace(rid="a", bootstrap_room=None, origin_input_ids=[11, 12, 13]),
            SimpleNamespace(rid="b", bootstrap_room=5, origin_input_ids=[21, 22]),
            SimpleNamespace(rid="c", bootstrap_room=-3, origin_input_ids=[31])]
    host = extend_expectations_on_host(reqs=reqs, prefix_lens=[1, 0, 2], extend_lens=[2, 4, 1],
                                       num_tokens=8, oracle=oracle, pin_memory=False)
    tokens, positions = host.tolist()

    def predicted(gid: int, position: int) -> int:
        return hash_oracle_token_scalar(generalized_req_id=gid, position=position,
                                        vocab_size=VOCAB_SIZE)

    rid_c = stable_hash_str_to_i64("c")  # room -3 is invalid: c is known by its rid
    assert positions == [1, 2, 0, 1, 2, 3, 2, -1]
    assert tokens == [12, 13, 21, 22, predicted(5, 2), predicted(5, 3), predicted(rid_c, 2), -1]
    # a row's prompt tokens come from its already-read history array where one is given
    from_arrays = extend_expectations_on_host(
        reqs=reqs, prefix_lens=[1, 0, 2], extend_lens=[2, 4, 1], num_tokens=8, oracle=oracle,
        pin_memory=False, prompt_sources=[np.array([11, 12, 13]), [21, 22], [31]])
    assert from_arrays.tolist() == host.tolist()
    # tokens beyond num_tokens are cut
    cut = extend_expectations_on_host(reqs=reqs[:1], prefix_lens=[0], extend_lens=[3],
                                      num_tokens=1, oracle=oracle, pin_memory=False)
    assert cut.tolist() == [[11], [0]]
    # a row SGLang gives a negative length (a mixed chunk cut below zero) shifts the rows after
    # it, as their start offsets do: only the token indices inside the forward are written
    shifted = extend_expectations_on_host(
        reqs=reqs, prefix_lens=[1, 0, 2], extend_lens=[2, -3, 2], num_tokens=2, oracle=oracle,
        pin_memory=False)
    # row a at [0, 2); row b at 2 writes nothing; row c starts at 2 - 3 = -1: its token 1 at 0
    assert shifted.tolist() == [[predicted(rid_c, 3), 13], [3, 2]]
    # the numpy oracle is the scalar reference, over the whole int64 id range
    positions_np = np.array([0, 1, 2**31, 2**40 + 3], dtype=np.int64)
    for gid in (0, 5, -1, -(2**63), 2**63 - 1, rid_c):
        assert oracle.host_tokens(generalized_req_id=gid, positions=positions_np).tolist() == [
            predicted(gid, int(p)) for p in positions_np]


def _installed_not_serving(views: list) -> tuple[SimulatedServer, CanaryRunner]:
    """A runner's canary between ``on_memory_pool`` and ``on_serving_start``: start-up time."""
    server = SimulatedServer(page_size=4, num_pages=16, max_requests=4, max_context_len=32,
                             forward=lambda batch: None)
    runner = attach_canary_runner(
        model_runner=server.runner,
        runner=CanaryRunner(config=token_config(), model_runner=server.runner,
                            kernels=_recording(KERNELS, views)),
    )
    runner.install_oracle()
    runner.on_memory_pool()
    return server, runner


def test_start_up_forwards_without_request_ids_skip_the_expectations_until_serving() -> None:
    views = []
    server, runner = _installed_not_serving(views)
    dummy = _decode_batch(2)  # ModelRunner._dummy_run builds its batch without init_new
    del dummy.rids_int, dummy.bootstrap_room_ids_int
    dummy.token_to_kv_pool = server.kv_pool
    server.runner.model.forward(dummy.input_ids, dummy.positions, dummy)
    assert views[-1].expected_input_ids is None and views[-1].verify_token
    runner.on_serving_start()
    with pytest.raises(MissingRequestIdsError, match="SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"):
        server.runner.model.forward(dummy.input_ids, dummy.positions, dummy)


def test_write_input_assert_needs_an_installed_oracle() -> None:
    server = SimulatedServer(page_size=1, num_pages=16, max_requests=2, max_context_len=16,
                             forward=lambda batch: None)
    runner = CanaryRunner(config=token_config(), model_runner=server.runner, kernels=KERNELS)
    with pytest.raises(RuntimeError, match="no oracle is installed"):
        runner.on_memory_pool()


def test_start_up_line_describes_the_token_checks(caplog_canary) -> None:
    token_check_server(token_config())
    line = next(m for m in caplog_canary.messages if m.startswith("KV canary installed"))
    assert "token checks: verify_token on, write_input_assert on (oracle; 16 tokens " in line
    assert "token history 9 rows x 96" in line


# ----------------------------------------------------------------------------- memory


def test_the_reservation_bounds_the_pools_sglang_will_build() -> None:
    server_args = SimpleNamespace(
        max_running_requests=None, speculative_num_draft_tokens=None, max_prefill_tokens=16384,
        chunked_prefill_size=8192, cuda_graph_max_bs=256, speculative_algorithm=None,
        enable_hierarchical_cache=False,
    )
    assert request_rows_bound(server_args, dp_size=1) == 4097  # SGLang caps at 4096 (+ row 0)
    server_args.max_running_requests = 64
    assert request_rows_bound(server_args, dp_size=2) == 33
    assert context_columns_bound(server_args, context_len=4096) == 4100
    server_args.speculative_num_draft_tokens = 3
    assert context_columns_bound(server_args, context_len=4096) == 4103
    assert max_tokens_per_forward(server_args, max_running_requests=64) == 16384

    # padding record, counters, owner chains (33 rows), the live row count and the seq_lens
    # mirror (max(33 request rows, 256 graph rows)), upload staging
    base = (1 * RECORD_BYTES + NUM_COUNTERS * 8 + 33 * 8 + (1 + 256) * 8
            + UPLOAD_STAGING_WORDS * 8)
    history = 33 * 4103 * 4 + 33 * 8
    write_expectations = 16384 * 2 * 8
    graph_ids = 256 * (2 * 8 + 4)  # int64 rids + rooms, int32 next token per graph row
    for config, expected in (
        (CanaryConfig(mode=CanaryMode.LOG), base + 1024 * RING_ROW_FIELDS * 8),
        (token_config(write_input=False), base + 512 * RING_ROW_FIELDS * 8 + history),
        (token_config(),
         base + 512 * RING_ROW_FIELDS * 8 + history + write_expectations + graph_ids),
    ):
        model_runner = SimpleNamespace(server_args=server_args, dp_size=2, page_size=1,
                                       device="cpu", model_config=SimpleNamespace(context_len=4096))
        attach_canary_runner(model_runner=model_runner, runner=CanaryRunner(
            config=config, model_runner=model_runner, kernels=KERNELS))
        assert reserve_fixed_bytes(10**10, model_runner, 0) == 10**10 - expected

    # EAGLE: the draft canary gets the same buffers but the write expectations; each adds a
    # second owner-chain row (the draft steps' scratch) and the uniform blocks (sizes 1 and D)
    server_args.speculative_algorithm = "EAGLE"
    assert max_tokens_per_forward(server_args, max_running_requests=8000) == 8000 * 3  # D per row
    eagle_base = base + 33 * 8 + 2 * 2 * 256 * 8
    for config, one in (
        (CanaryConfig(mode=CanaryMode.LOG), eagle_base + 1024 * RING_ROW_FIELDS * 8),
        (token_config(write_input=False), eagle_base + 512 * RING_ROW_FIELDS * 8 + history),
    ):
        model_runner = SimpleNamespace(server_args=server_args, dp_size=2, page_size=1,
                                       device="cpu", model_config=SimpleNamespace(context_len=4096))
        attach_canary_runner(model_runner=model_runner, runner=CanaryRunner(
            config=config, model_runner=model_runner, kernels=KERNELS))
        assert reserve_fixed_bytes(10**10, model_runner, 0) == 10**10 - 2 * one


def test_the_reservation_covers_what_is_allocated() -> None:
    server, runner = token_check_server(token_config())
    server.runner.server_args = dataclasses.replace(
        server.runner.server_args, max_running_requests=server.runner.max_running_requests)
    reserved = runner.memory.fixed_buffers(page_size=server.page_size)
    history = runner.token_checks.history
    allocated = {
        "ring": runner.state.ring.numel() * 8,
        "counters": runner.state.counters.numel() * 8,
        "token_history": history.tokens.numel() * 4 + history.lens.numel() * 8,
        "write_expectations": runner.token_checks.expectations.capacity * 2 * 8,
    }
    for name, size in allocated.items():
        assert 0 < size <= getattr(reserved, name), name
    assert history.tokens.shape[0] == reserved.owner_chains // 8  # the rows bound is exact here
    # every buffer the runner reports as its own (owner chains, seq_lens mirror, upload staging
    # included) fits its reservation; the records come from the KV cell size instead
    owned = runner.device_bytes()
    assert set(owned) - {"records"} <= set(reserved.__slots__)
    for name, size in owned.items():
        if name != "records":
            assert size <= getattr(reserved, name), name
    assert owned["records"] == runner.state.num_slots * RECORD_BYTES


def test_decode_steps_upload_no_row_sections(monkeypatch) -> None:
    """The decode steps of a batch upload the seq_lens mirror only: no row section is cut or
    copied, and the history stays exact (appended on the device)."""
    server, runner = token_check_server(token_config(write_input=False))
    requests = [_request(server, rid, _prompt(seed, 6)) for seed, rid in ((1, "a"), (2, "b"))]
    server.extend([(r, 6) for r in requests])
    cuts = []  # the cuts of uploaded copies (not of the host buffer itself)
    original = RowUpdates.sections_on

    def counting_sections_on(self, packed):
        if packed is not self.packed:
            cuts.append(packed.shape[0])
        return original(self, packed)

    monkeypatch.setattr(RowUpdates, "sections_on", counting_sections_on)
    for _ in range(5):
        server.decode(requests)
    assert cuts == []
    history = runner.token_checks.history
    for r in requests:
        assert history.lens[r.req_pool_idx].item() == len(r.tokens)
        assert history.tokens[r.req_pool_idx, : len(r.tokens)].tolist() == r.tokens


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
