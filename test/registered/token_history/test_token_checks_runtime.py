"""The token checks wired into the canary runtime, on CPU against SGLang's own objects.

* The ``ForwardBatch.init_new`` hook: selected by the hook table only with a token check on;
  attaches the history snapshot (and, write-input assert on, the prompt lengths of an
  EXTEND/MIXED batch) to real ForwardBatch objects made by the real ``init_new``; applied by
  SGLang's HookRegistry to the real classmethod (``batch`` as a keyword too).
* ``run_step`` refreshes the history before the forward; the in-forward part (what graph
  capture records and replays) never does, and reads only the persistent history tensors.
* Verify-token reports a slot holding a token the request never had; the write-input assert
  compares prompt tokens with the history and generated tokens (also in MIXED batches) with the
  oracle; the history alone (verify-token off) is only the write fallback.
* Start-up forwards without request ids, the eager overflow buffer, the EAGLE draft-decode
  switch, the memory reservation and the start-up line.
"""

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

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

from sglang.jit_kernel.kv_canary.consts import FIELD_TOKEN, CheckKind, Reason
from sglang.srt.kv_canary import core_hooks
from sglang.srt.kv_canary.runner.kernel_inputs import build_batch_view
from sglang.srt.kv_canary.config import (
    CanaryConfig,
    CanaryMode,
    set_active_config_for_testing,
)
from sglang.srt.kv_canary.hook_targets import select_hook_specs
from sglang.srt.kv_canary.runner.memory_budget import fixed_bytes
from sglang.srt.kv_canary.req_to_expected_token_ids_manager import (
    FORWARD_BATCH_ATTRIBUTE,
    ReqToVerifyExpectedTokens,
)
from sglang.srt.kv_canary.request_id_hooks import attach_request_ids_after_init_new
from sglang.srt.kv_canary.token_oracle.request_ids import MissingRequestIdsError, set_request_ids
from sglang.srt.kv_canary.runtime import install_canary, runtime_of
from sglang.srt.kv_canary.selfcheck.simulation import (
    VOCAB_SIZE,
    SimulatedRequest,
    SimulatedServer,
)
from sglang.srt.kv_canary.token_checks.checks import (
    PROMPT_LENS_ATTR,
    TokenChecks,
    write_input_assert_applies,
)
from sglang.srt.kv_canary.token_checks.history_hooks import attach_token_history_after_init_new
from sglang.srt.kv_canary.token_checks.sizing import (
    context_columns,
    max_tokens_per_forward,
    request_rows_bound,
    token_check_bytes,
)
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.monitor.violations import find_violation_rows
from sglang.srt.model_executor import forward_batch_info
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="kv-canary-cpu")

_FB_INIT_NEW = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"
_HISTORY_HOOK = (
    "sglang.srt.kv_canary.token_checks.history_hooks:attach_token_history_after_init_new"
)


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


def _poll(server: SimulatedServer) -> None:
    runtime_of(server.runner).monitor.poll()


# ----------------------------------------------------------------------------- the init_new hook


@pytest.mark.parametrize(
    "changes, selected",
    [
        ({}, False),
        ({"enable_verify_token_assert": True}, True),
        ({"enable_write_input_assert": True, "enable_token_oracle": True}, True),
    ],
)
def test_the_hook_table_snapshots_histories_only_with_a_token_check(changes, selected) -> None:
    config = CanaryConfig(mode=CanaryMode.LOG, **changes)
    specs = [s for s in select_hook_specs(config) if s.implementation == _HISTORY_HOOK]
    assert len(specs) == int(selected)
    if selected:
        assert specs[0].target == _FB_INIT_NEW and specs[0].hook_type == "after"
    assert not [s for s in select_hook_specs(CanaryConfig(**changes))
                if s.implementation == _HISTORY_HOOK]  # canary off: never


def _real_forward_batch(server, reqs, *, mode, prefix_lens=None, monkeypatch) -> ForwardBatch:
    """The real ``ForwardBatch.init_new`` followed by the hooks, as the hooked classmethod runs."""
    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda: False)
    runner = prepare_for_init_new(server.runner)
    batch = model_worker_batch(mode=mode, reqs=reqs, extend_prefix_lens=prefix_lens)
    forward_batch = ForwardBatch.init_new(batch, runner)
    attach_request_ids_after_init_new(forward_batch, ForwardBatch, batch, runner)
    attach_token_history_after_init_new(forward_batch, ForwardBatch, batch=batch,
                                        model_runner=runner)
    return forward_batch


def test_init_new_hook_snapshots_real_forward_batches(monkeypatch) -> None:
    server, _ = token_check_server(token_config())
    reqs = sglang_reqs([[5, 6, 7], [8, 9]], outputs=[[], [10]])
    extend = _real_forward_batch(server, reqs, mode=ForwardMode.EXTEND, prefix_lens=[0, 1],
                                 monkeypatch=monkeypatch)
    info = getattr(extend, FORWARD_BATCH_ATTRIBUTE)
    assert info.req_pool_indices.tolist() == [1, 2]
    assert info.req_all_ids_lens.tolist() == [3, 3]
    assert info.req_all_ids_flat.tolist() == [5, 6, 7, 8, 9, 10]
    assert getattr(extend, PROMPT_LENS_ATTR).tolist() == [3, 2]

    runtime_of(server.runner).token_checks.populate_history(extend)
    reqs[0].output_ids.append(11)
    decode = _real_forward_batch(server, reqs, mode=ForwardMode.DECODE, monkeypatch=monkeypatch)
    info = getattr(decode, FORWARD_BATCH_ATTRIBUTE)
    assert info.req_all_ids_flat.tolist() == [11]  # incremental: only what the pool lacks
    assert info.req_all_ids_lens.tolist() == [4, 3]
    assert getattr(decode, PROMPT_LENS_ATTR, None) is None  # decode rows: the oracle decides


def test_without_the_write_input_assert_no_prompt_lengths_are_attached(monkeypatch) -> None:
    server, _ = token_check_server(token_config(write_input=False))
    extend = _real_forward_batch(server, sglang_reqs([[5, 6, 7]]), mode=ForwardMode.EXTEND,
                                 prefix_lens=[0], monkeypatch=monkeypatch)
    assert getattr(extend, FORWARD_BATCH_ATTRIBUTE).num_tokens == 3
    assert getattr(extend, PROMPT_LENS_ATTR, None) is None


def test_init_new_hook_refuses_a_batch_without_one_request_per_row() -> None:
    server, _ = token_check_server(token_config())
    batch = SimpleNamespace(reqs=sglang_reqs([[1, 2]]))
    forward_batch = SimpleNamespace(batch_size=2, forward_mode=ForwardMode.DECODE)
    with pytest.raises(ValueError, match="2 rows but 1 requests"):
        attach_token_history_after_init_new(forward_batch, ForwardBatch, batch, server.runner)
    batch.reqs = None
    with pytest.raises(ValueError, match="2 rows but no requests"):
        attach_token_history_after_init_new(forward_batch, ForwardBatch, batch, server.runner)


def test_init_new_hook_on_a_runner_without_token_checks_is_an_installation_error() -> None:
    server, _ = token_check_server(CanaryConfig(mode=CanaryMode.LOG))
    batch = SimpleNamespace(reqs=[])
    with pytest.raises(RuntimeError, match="keeps no token history"):
        attach_token_history_after_init_new(SimpleNamespace(batch_size=0), ForwardBatch,
                                            batch, server.runner)


def test_hook_registry_applies_the_hook_to_the_real_classmethod() -> None:
    """In a fresh interpreter: the hook table's init_new hooks, applied by SGLang's registry to
    ``ForwardBatch.init_new`` (a classmethod), run on a real call with keyword arguments."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _token_check_batches import (model_worker_batch, prepare_for_init_new,
                                          sglang_reqs, token_check_server, token_config)
        from sglang.srt.kv_canary import hook_targets
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang.srt.model_executor import forward_batch_info
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        config = token_config()
        hook_targets.HOOK_SPECS = tuple(s for s in hook_targets.HOOK_SPECS
                                        if s.target.endswith("ForwardBatch.init_new"))
        hook_targets.register_hooks(config)
        HookRegistry.apply_hooks()
        hook_targets.verify_hooks_applied()
        forward_batch_info.enable_num_token_non_padded = lambda: False
        server, runtime = token_check_server(config)
        runner = prepare_for_init_new(server.runner)
        batch = model_worker_batch(mode=ForwardMode.EXTEND, reqs=sglang_reqs([[4, 5, 6]]),
                                   extend_prefix_lens=[0])
        forward_batch = ForwardBatch.init_new(batch=batch, model_runner=runner)
        print(forward_batch.req_all_ids_info.req_all_ids_flat.tolist(),
              forward_batch.kv_canary_prompt_lens.tolist(), forward_batch.rids_int.shape[0])
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[4, 5, 6] [3] 1"


# ----------------------------------------------------------------------------- before the forward


def test_run_step_refreshes_the_history_before_the_forward() -> None:
    server, runtime = token_check_server(token_config())
    history = runtime.token_checks.history
    seen = []
    wrapper = server.runner.model.forward
    model_forward = wrapper.original

    def recording_model_forward(input_ids, positions, forward_batch):
        seen.append(history.valid_lens_by_row.tolist())  # what the model's forward finds
        return model_forward(input_ids, positions, forward_batch)

    wrapper.original = recording_model_forward
    first = _request(server, "a", _prompt(1, 5))
    server.extend([(first, 5)])
    assert seen[-1][first.req_pool_idx] == 5  # already scattered when the forward ran
    server.decode([first])
    assert seen[-1][first.req_pool_idx] == 6  # the first output token, sampled at prefill
    assert history.tokens[first.req_pool_idx, :7].tolist() == first.tokens[:6] + [0]


def test_the_in_forward_part_never_refreshes_the_history() -> None:
    """What graph capture records (and replays) is the wrapped ``model.forward``: it reads the
    persistent history tensors and never scatters into them."""
    server, runtime = token_check_server(token_config(write_input=False))
    request = _request(server, "a", _prompt(2, 6))
    server.extend([(request, 6)])
    history = runtime.token_checks.history
    before = (history.tokens.clone(), history.valid_lens_by_row.clone())
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=1,
        input_ids=torch.tensor([request.tokens[-1]]),
        req_pool_indices=torch.tensor([request.req_pool_idx]),
        seq_lens=torch.tensor([7]), out_cache_loc=torch.tensor([0]), seq_lens_sum=7,
        positions=torch.tensor([6]), token_to_kv_pool=server.kv_pool,
    )
    setattr(batch, FORWARD_BATCH_ATTRIBUTE, history.snapshot([request]))  # never populated
    server.runner.model.forward(batch.input_ids, batch.positions, batch)
    assert torch.equal(history.tokens, before[0])
    assert torch.equal(history.valid_lens_by_row, before[1])
    view = build_batch_view(batch, token_checks=runtime.token_checks)
    assert view.expected_token_pool.data_ptr() == history.tokens.data_ptr()
    assert view.expected_token_valid_lens.data_ptr() == history.valid_lens_by_row.data_ptr()
    assert view.verify_token and view.expected_input_ids is None


def test_a_live_batch_without_a_snapshot_fails_loudly() -> None:
    server, _ = token_check_server(token_config(write_input=False), forward=None)
    server.init_new_hooks = ()  # the init_new hook "did not run"
    request = _request(server, "a", _prompt(3, 4))
    with pytest.raises(RuntimeError, match="no 'req_all_ids_info' snapshot"):
        server.extend([(request, 4)])


# ----------------------------------------------------------------------------- the checks


def test_verify_token_reports_a_slot_holding_a_token_the_request_never_had(caplog_canary) -> None:
    server, runtime = token_check_server(token_config(write_input=False))
    request = _request(server, "a", _prompt(4, 9))
    server.extend([(request, 9)])
    server.decode([request])
    slot = int(server.req_to_token_pool.req_to_token[request.req_pool_idx, 3])
    runtime.state.records[slot, FIELD_TOKEN] += 1
    server.decode([request])
    _poll(server)
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


def test_write_input_compares_prompt_tokens_with_the_history(caplog_canary) -> None:
    prompt = _prompt(5, 7)
    server, _ = token_check_server(
        token_config(), forward=_corrupting_forward(mode=ForwardMode.EXTEND, token_index=4,
                                                    value=(prompt[4] + 1) % VOCAB_SIZE))
    request = _request(server, "a", prompt)
    server.extend([(request, 7)])
    server.decode([request])
    _poll(server)
    write_rows = [r for r in _rows(caplog_canary) if r.check == CheckKind.WRITE]
    assert [(r.position, r.reasons, r.expected_token) for r in write_rows] == [
        (4, Reason.WRITE_TOKEN, prompt[4])
    ]
    verify_rows = [r for r in _rows(caplog_canary) if r.check != CheckKind.WRITE]
    assert verify_rows and all(r.position == 4 and r.reasons == Reason.VERIFY_TOKEN
                               for r in verify_rows)  # the next forward: the slot is wrong


def test_write_input_predicts_the_generated_tokens_of_mixed_batches(caplog_canary) -> None:
    """A decode row inside a MIXED batch consuming a token the oracle did not emit (the history
    has it, as after a next-token swap): only the write-input assert can see it."""
    server, _ = token_check_server(token_config())
    decoding = _request(server, "dec", _prompt(6, 5))
    server.extend([(decoding, 5)])
    oracle_token = decoding.output[-1]
    decoding.output[-1] = (oracle_token + 1) % VOCAB_SIZE  # the scheduler recorded a foreign one
    chunked = _request(server, "chunk", _prompt(7, 9))
    server.extend([(chunked, 4)], decoding=[decoding])  # MIXED
    _poll(server)
    server.decode([decoding])
    _poll(server)
    rows = _rows(caplog_canary)
    assert [(r.check, r.position, r.reasons, r.expected_token) for r in rows] == [
        (CheckKind.WRITE, 5, Reason.WRITE_TOKEN, oracle_token)
    ]


def test_the_history_alone_is_only_the_write_fallback_when_verify_token_is_off(
        caplog_canary) -> None:
    server, runtime = token_check_server(token_config(verify=False))
    request = _request(server, "a", _prompt(8, 6))
    server.extend([(request, 6)])
    slot = int(server.req_to_token_pool.req_to_token[request.req_pool_idx, 2])
    runtime.state.records[slot, FIELD_TOKEN] += 1  # would be verify_token (and chain)
    server.decode([request])
    _poll(server)
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


def _token_checks(*, capacity: int) -> TokenChecks:
    return TokenChecks(
        history=ReqToVerifyExpectedTokens(num_rows=4, max_context_len=32, device="cpu",
                                          scatter=KERNELS.scatter_req_token_ids()),
        verify_token=True,
        oracle=TokenOracleManager(oracle=HashOracle(vocab_size=VOCAB_SIZE)),
        expected_capacity=capacity,
    )


def _decode_batch(rows: int) -> ForwardBatch:
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=rows,
        input_ids=torch.zeros(rows, dtype=torch.int64),
        req_pool_indices=torch.arange(1, rows + 1), seq_lens=torch.full((rows,), 5),
        out_cache_loc=torch.zeros(rows, dtype=torch.int64), seq_lens_sum=5 * rows,
        positions=torch.full((rows,), 4),
    )
    set_request_ids(batch, rids_int=torch.arange(rows, dtype=torch.int64),
                    bootstrap_room_ids_int=torch.full((rows,), -1))
    return batch


def test_expectations_grow_for_large_eager_forwards_and_keep_the_graph_buffer() -> None:
    checks = _token_checks(capacity=4)
    small = checks.view_fields(_decode_batch(3))["expected_input_ids"]
    large = checks.view_fields(_decode_batch(9))["expected_input_ids"]
    again = checks.view_fields(_decode_batch(3))["expected_input_ids"]
    assert small.data_ptr() == again.data_ptr()  # what a captured graph holds never moves
    assert large.data_ptr() != small.data_ptr() and large.shape == (9,)
    assert checks.view_fields(_decode_batch(7))["expected_input_ids"].data_ptr() == \
        large.data_ptr()  # the overflow buffer grows once, then is reused


def test_start_up_forwards_without_request_ids_skip_the_expectations_until_serving() -> None:
    checks = _token_checks(capacity=8)
    dummy = _decode_batch(2)
    del dummy.rids_int  # ModelRunner._dummy_run builds its batch without init_new
    fields = checks.view_fields(dummy)
    assert "expected_input_ids" not in fields and fields["verify_token"]
    checks.start_serving()
    with pytest.raises(MissingRequestIdsError, match="SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"):
        checks.view_fields(dummy)


def test_write_input_assert_needs_an_installed_oracle() -> None:
    server = SimulatedServer(page_size=1, num_pages=16, max_requests=2, max_context_len=16,
                             forward=lambda batch: None)
    with pytest.raises(RuntimeError, match="no oracle is installed"):
        install_canary(model_runner=server.runner, config=token_config(), kernels=KERNELS,
                       memory_source="test")


def test_start_up_line_describes_the_token_checks(caplog_canary) -> None:
    token_check_server(token_config())
    line = next(m for m in caplog_canary.messages if m.startswith("KV canary installed"))
    assert "token checks: verify_token on, write_input_assert on (oracle; 16 tokens " in line
    assert "token history 9 rows x 96" in line


# ----------------------------------------------------------------------------- memory


def test_the_reservation_bounds_the_pools_sglang_will_build() -> None:
    server_args = SimpleNamespace(
        max_running_requests=None, speculative_num_draft_tokens=None, max_prefill_tokens=16384,
        chunked_prefill_size=8192, cuda_graph_max_bs=256,
    )
    assert request_rows_bound(server_args, dp_size=1) == 4097  # SGLang caps at 4096 (+ row 0)
    server_args.max_running_requests = 64
    assert request_rows_bound(server_args, dp_size=2) == 33
    assert context_columns(server_args, context_len=4096) == 4100
    server_args.speculative_num_draft_tokens = 3
    assert context_columns(server_args, context_len=4096) == 4103
    assert max_tokens_per_forward(server_args, max_running_requests=64) == 16384

    runner = SimpleNamespace(server_args=server_args, dp_size=2, page_size=1,
                             model_config=SimpleNamespace(context_len=4096))
    token_bytes = token_check_bytes(rows=33, columns=4103, expected_tokens=16384)
    assert token_bytes == 33 * 4103 * 4 + 33 * 8 + (1 << 12) * 8 + 16384 * 16
    for config, extra in ((CanaryConfig(mode=CanaryMode.LOG), 0),
                          (token_config(write_input=False), token_bytes)):
        set_active_config_for_testing(config)
        try:
            available = core_hooks.reserve_fixed_canary_bytes(10**10, runner, 0)
        finally:
            set_active_config_for_testing(None)
        assert available == 10**10 - fixed_bytes(ring_capacity=config.ring_capacity,
                                                 page_size=1) - extra


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
