"""The runner's components through their public methods, on CPU: the row uploader (seq_lens
mirror, staged sections, commit), the token checks (what each forward kind compares, which
samples join the history) and the memory budget's report."""

import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from sglang.jit_kernel.kv_canary import append_history_ref, scatter_req_token_ids_ref
from sglang.jit_kernel.kv_canary.hashing import chain_after_scalar
from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.batch.forward_kind import ForwardKind
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.runner.memory_budget import MemoryBudget
from sglang.srt.kv_canary.runner.request_rows import RequestRows
from sglang.srt.kv_canary.runner.row_uploader import STAGED_LAYOUTS, RowUploader
from sglang.srt.kv_canary.runner.token_checks import TokenChecks
from sglang.srt.kv_canary.runner.upload_buffers import UploadBufferRing
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedServerArgs
from sglang.srt.kv_canary.token_history.history import TokenHistory
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

_ROWS, _COLUMNS = 6, 16


class _Req:
    def __init__(self, rid: str, tokens: list[int], row: int) -> None:
        self.rid, self.origin_input_ids, self.output_ids = rid, tokens, []
        self.req_pool_idx, self.retraction_count = row, 0


def _history() -> TokenHistory:
    return TokenHistory(
        num_rows=_ROWS, max_context_len=_COLUMNS, device="cpu",
        scatter=scatter_req_token_ids_ref.scatter_req_token_ids_torch_reference,
        bind_append=append_history_ref.bind_append_history_tokens,
    )


def _uploader(*, history: TokenHistory | None, staging_words: int = 64,
              admissions: list | None = None) -> tuple[RowUploader, RequestRows, CanaryDeviceState]:
    ring = UploadBufferRing(slots=4, words=64, pin_memory=False)
    ring.open(landed=lambda: 1 << 62)  # host copies: complete at once
    rows = RequestRows(num_rows=_ROWS, token_history=history is not None, owner_chains=True,
                       pin_memory=False, upload_buffers=ring)
    state = CanaryDeviceState.zeros(num_slots=32, req_to_token=torch.zeros(
        (_ROWS, _COLUMNS), dtype=torch.int32), ring_capacity=4)
    recorded = admissions if admissions is not None else []
    uploader = RowUploader(
        state=state, request_rows=rows, token_history=history,
        admission_check=lambda **kwargs: recorded.append(kwargs), ring=ring, mirror_rows=8,
        staging_words=staging_words, device=torch.device("cpu"),
    )
    return uploader, rows, state


def test_the_seq_lens_mirror_takes_each_batch_s_rows_and_refuses_a_larger_batch() -> None:
    uploader, _, _ = _uploader(history=None)
    mirror = uploader.seq_lens_mirror
    uploader.upload_seq_lens(torch.tensor([5, 9, 2]), mark=1)
    uploader.upload_seq_lens(torch.tensor([7]), mark=2)
    assert mirror[:3].tolist() == [7, 9, 2] and uploader.seq_lens_mirror is mirror
    uploader.upload_seq_lens(torch.tensor([], dtype=torch.int64), mark=3)  # nothing to copy
    with pytest.raises(ValueError, match="a batch of 9 rows is larger than the seq_lens mirror"):
        uploader.upload_seq_lens(torch.arange(9), mark=4)
    assert uploader.live_rows.tolist() == [0]  # the empty batch's count
    # the mirror's 8 rows and the live row count before them
    assert uploader.device_bytes == {"seq_lens_mirror": (1 + 8) * 8, "upload_staging": 64 * 8}


def test_applied_updates_reach_the_history_and_the_owner_chains_and_are_committed() -> None:
    history = _history()
    uploader, rows, state = _uploader(history=history)
    req = _Req("a", [3, 4, 5], row=2)
    updates = rows.prepare(reqs=[req], prefix_lens=[2], seq_lens=[3])
    uploader.apply(updates, mark=1)
    assert history.lens[2].item() == 3 and history.tokens[2, :3].tolist() == [3, 4, 5]
    assert state.owner_chains[2].item() == chain_after_scalar(tokens=[3, 4])
    # committed: the same request sends nothing more
    again = rows.prepare(reqs=[req], prefix_lens=[3], seq_lens=[4])
    assert again.empty
    uploader.apply(again, mark=2)  # an empty update is committed only


def test_deferred_admissions_launch_the_admission_check_with_their_sections() -> None:
    checks: list = []
    uploader, rows, _ = _uploader(history=_history(), admissions=checks)
    cached = _Req("cached", [4, 5, 6], row=1)
    early = rows.prepare(reqs=[cached], prefix_lens=[2], seq_lens=[3], defer_new_owners=True)
    uploader.apply(early, mark=1)
    assert checks == []
    uploader.apply(rows.prepare_deferred(early.deferred), mark=2)
    (call,) = checks
    assert call["req_pool_indices"].tolist() == [1] and call["prefix_lens"].tolist() == [2]


def test_layouts_are_cut_once_and_an_oversized_upload_gets_its_own_buffer() -> None:
    history = _history()
    uploader, rows, _ = _uploader(history=history, staging_words=16)
    for index in range(STAGED_LAYOUTS + 2):  # more layouts than are kept: the oldest goes
        req = _Req(f"r{index}", list(range(1, index % 3 + 2)), row=1 + index % 4)
        uploader.apply(rows.prepare(reqs=[req], prefix_lens=[0], seq_lens=[1]), mark=index)
        assert history.tokens[req.req_pool_idx, : len(req.origin_input_ids)].tolist() == \
            req.origin_input_ids
    long = _Req("long", list(range(100, 112)), row=5)  # 12 tokens: more than the 16 words hold
    uploader.apply(rows.prepare(reqs=[long], prefix_lens=[0], seq_lens=[12]), mark=99)
    assert history.lens[5].item() == 12 and history.tokens[5, :12].tolist() == long.origin_input_ids


def _checks(*, appends_sampled: bool = True, verify_token: bool = True) -> TokenChecks:
    return TokenChecks(history=_history(), expectations=None, oracle=None,
                       verify_token=verify_token, appends_sampled=appends_sampled,
                       device=torch.device("cpu"))


def _sampled_batch(rows: list[int], seq_lens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(req_pool_indices=torch.tensor(rows), seq_lens=torch.tensor(seq_lens))


@pytest.mark.parametrize("kind", [ForwardKind.DECODE, ForwardKind.EXTEND])
def test_samples_of_decode_and_extend_forwards_join_the_history(kind: ForwardKind) -> None:
    checks = _checks()
    checks.history.lens[3] = 4
    checks.on_sampled(kind=kind, forward_batch=_sampled_batch([3, 0], [4, 9]),
                      next_token_ids=torch.tensor([88, 99]))
    assert checks.history.lens.tolist() == [0, 0, 0, 5, 0, 0]  # padding row 0 untouched
    assert checks.history.tokens[3, 4].item() == 88


@pytest.mark.parametrize("kind", [ForwardKind.TARGET_VERIFY, ForwardKind.DRAFT_EXTEND,
                                  ForwardKind.DRAFT_DECODE, None])
def test_other_kinds_and_host_sent_histories_append_nothing(kind) -> None:
    for checks in (_checks(), _checks(appends_sampled=False)):
        checks.history.lens[3] = 4
        for k in (kind, ForwardKind.DECODE if not checks.appends_sampled else kind):
            checks.on_sampled(kind=k, forward_batch=_sampled_batch([3], [4]),
                              next_token_ids=torch.tensor([88]))
        assert checks.history.lens[3].item() == 4


def test_padded_batches_append_the_rows_every_tensor_has() -> None:
    """DP attention pads the row tensors: only the rows with a sampled token are appended."""
    checks = _checks()
    checks.history.lens[2] = 1
    checks.history.lens[4] = 1
    checks.on_sampled(kind=ForwardKind.DECODE, forward_batch=_sampled_batch([2, 4, 0], [1, 1, 1]),
                      next_token_ids=torch.tensor([7]))
    assert checks.history.lens[2].item() == 2 and checks.history.lens[4].item() == 1


def test_the_view_fields_are_the_history_and_the_verify_switch() -> None:
    checks = _checks(verify_token=False)
    batch = SimpleNamespace(forward_mode=None, spec_info=None)
    fields = checks.view_fields(batch, inputs=None)
    assert fields["token_history"] is checks.history.tokens
    assert fields["token_history_lens"] is checks.history.lens
    assert fields["verify_token"] is False and "expected_input_ids" not in fields
    assert "verify_token off, write_input_assert off" in checks.describe()
    assert "sampled tokens appended on the device" in checks.describe()


def test_the_memory_report_warns_when_the_fixed_buffers_outgrow_their_reservation(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    model_runner = SimpleNamespace(page_size=1, dp_size=1,
                                   server_args=SimulatedServerArgs(max_running_requests=3),
                                   model_config=SimpleNamespace(context_len=60))
    budget = MemoryBudget(config=CanaryConfig(mode=CanaryMode.LOG, ring_capacity=4),
                          model_runner=model_runner)
    reserved = budget.fixed_buffers(page_size=1)
    assert budget.reserve(10**6) == 10**6 - reserved.total
    budget.report(allocated={"records": 320, "ring": reserved.ring}, page_size=1)
    assert not [m for m in caplog.messages if "exceed" in m]
    budget.report(allocated={"records": 320, "ring": reserved.total + 1}, page_size=1)
    assert [m for m in caplog.messages if "exceed the" in m]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
