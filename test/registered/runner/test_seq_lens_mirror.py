"""The seq_lens mirror through the real runner: the scheduler's ``seq_lens_cpu`` of the batch is
uploaded into the runner's persistent mirror before the forward, and the pre launch compares it
with the device ``seq_lens`` the forward uses. A ForwardBatch whose device ``seq_lens`` differs from ``seq_lens_cpu`` is reported with
``verify_seq_lens`` for that row (slot 0, position = the device value, stored / expected chain =
device / host value); rows that agree, padded graph rows and clean forwards report nothing."""

import logging
import sys

import pytest

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.monitor.violations import find_violation_rows
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.scenarios import server_hooks, install_canary_runner
from sglang.srt.kv_canary.selfcheck.simulation import (
    SimulatedModelRunner,
    SimulatedRequest,
    SimulatedServer,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

_CONFIG = CanaryConfig(mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL)


class _Drift:
    """Before the forward with index ``step``, add ``delta`` to the device ``seq_lens`` of batch
    row ``row`` (after the init_new hooks took ``seq_lens_cpu``); nothing else changes."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.row = 0
        self.delta = 0
        self.host: list[int] = []
        self.device: list[int] = []

    def apply(self, batch: ForwardBatch, *, step: int) -> None:
        if step != self.step:
            return
        batch.seq_lens[self.row] += self.delta
        self.host = batch.seq_lens_cpu.tolist()
        self.device = batch.seq_lens.tolist()


def _server(caplog, drift: _Drift) -> tuple[SimulatedServer, object]:
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")

    def forward(batch: ForwardBatch) -> object:
        drift.apply(batch, step=server.forwards)
        return around_forward(SimulatedModelRunner.forward, server.runner, batch)

    server = SimulatedServer(page_size=1, num_pages=64, max_requests=6, max_context_len=32,
                             forward=forward, hooks=server_hooks(_CONFIG))
    runner = install_canary_runner(model_runner=server.runner, config=_CONFIG,
                                   kernels=load_kernels(KernelBackend.TORCH_REFERENCE))
    return server, runner


def _requests(server: SimulatedServer, prompts: list[int]) -> list[SimulatedRequest]:
    requests = [SimulatedRequest(rid=f"r{i}", prompt=list(range(10 * i + 1, 10 * i + 1 + n)),
                                 max_new_tokens=20) for i, n in enumerate(prompts)]
    for request in requests:
        server.admit(request)
    return requests


def _rows(caplog, runner):
    runner.on_idle()  # report the last forward's rows
    return find_violation_rows(caplog.text)


def test_an_extend_batch_whose_device_seq_lens_drifted_is_reported(caplog) -> None:
    drift = _Drift()
    server, runner = _server(caplog, drift)
    requests = _requests(server, [5, 3, 4])
    server.extend([(r, 2) for r in requests])  # chunked: two tokens each
    assert _rows(caplog, runner) == []
    drift.step, drift.row, drift.delta = server.forwards, 1, 2
    server.extend([(r, len(r.prompt) - 2) for r in requests])
    assert drift.host == [5, 3, 4] and drift.device == [5, 5, 4]
    (row,) = _rows(caplog, runner)  # the extend layout reads extend_prefix_lens: nothing else
    assert (row.check, row.reasons, row.req_pool_idx, row.slot, row.position, row.step) == (
        CheckKind.PRE_VERIFY, int(Reason.VERIFY_SEQ_LENS), requests[1].req_pool_idx, 0, 5,
        drift.step,
    )
    assert (row.stored_token, row.expected_token) == (-1, -1)
    assert (row.stored_chain, row.expected_chain) == (5, 3)  # device value, host mirror


def test_a_decode_batch_whose_device_seq_lens_lags_is_reported_for_that_row(caplog) -> None:
    drift = _Drift()
    server, runner = _server(caplog, drift)
    requests = _requests(server, [5, 3, 4])
    server.extend([(r, len(r.prompt)) for r in requests])
    server.decode(requests)
    server.decode(requests[:1], padded_rows=3)  # padded rows: the mirror's rows 1.. are stale
    assert _rows(caplog, runner) == []
    drift.step, drift.row, drift.delta = server.forwards, 2, -1
    server.decode(requests)
    assert drift.host == [8, 5, 6] and drift.device == [8, 5, 5]
    rows = _rows(caplog, runner)
    lagging = requests[2].req_pool_idx
    assert {row.req_pool_idx for row in rows} == {lagging}  # the other rows agree: silent
    seq_lens_rows = [row for row in rows if row.reasons & Reason.VERIFY_SEQ_LENS]
    assert [(r.check, r.reasons, r.slot, r.position, r.stored_chain, r.expected_chain, r.step)
            for r in seq_lens_rows] == [
        (CheckKind.PRE_VERIFY, int(Reason.VERIFY_SEQ_LENS), 0, 5, 5, 6, drift.step)
    ]
    # the other rows of that forward come from the shifted prefix (the decode row's position
    # no longer matches the length the device uses)
    assert all(row.step == drift.step == 3 for row in rows)


def test_the_mirror_holds_the_scheduler_values_of_the_last_forward(caplog) -> None:
    server, runner = _server(caplog, _Drift())
    requests = _requests(server, [5, 3])
    server.extend([(r, len(r.prompt)) for r in requests])
    server.decode(requests)
    mirror = runner.uploader.seq_lens_mirror  # the runner's persistent device buffer
    assert mirror[:2].tolist() == [6, 4]
    address = mirror.data_ptr()
    server.decode(requests[1:], padded_rows=2)
    assert mirror[:1].tolist() == [5]  # the live row; rows past it keep older values
    # never reallocated: captured graphs keep reading it
    assert runner.uploader.seq_lens_mirror is mirror and mirror.data_ptr() == address
    assert _rows(caplog, runner) == []


def test_every_live_mode_uploads_the_scheduler_seq_lens(caplog) -> None:
    """Before every EXTEND, MIXED and DECODE forward the mirror's first rows are the batch's
    ``seq_lens_cpu`` (a decode step uploads nothing else)."""
    seen: list[tuple[ForwardMode, list[int], list[int]]] = []
    server, runner = _server(caplog, _Drift())
    original = server.forward

    def recording(batch: ForwardBatch) -> object:
        result = original(batch)
        rows = batch.batch_size
        seen.append((batch.forward_mode, runner.uploader.seq_lens_mirror[:rows].tolist(),
                     batch.seq_lens_cpu.tolist()))
        return result

    server.forward = recording
    first, second = _requests(server, [6, 3])
    server.extend([(first, 4)])
    server.extend([(first, 2)], decoding=[])
    server.extend([(second, 3)], decoding=[first])
    server.decode([first, second])
    assert [mode for mode, _, _ in seen] == [
        ForwardMode.EXTEND, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.DECODE
    ]
    assert all(uploaded == host for _, uploaded, host in seen)
    assert _rows(caplog, runner) == []


def test_layouts_that_alternate_are_cut_from_the_upload_area_once(caplog, monkeypatch) -> None:
    """Batch-1 requests, one after another, upload the same layout per prefill (a fresh new
    owner's chain; owner chains only): its sections are cut from the upload area once and
    reused, and they still read each forward's own upload (a drift in a late request is
    reported); the decode steps upload no row updates at all."""
    from sglang.srt.kv_canary.runner.request_rows import RowUpdates

    drift = _Drift()
    server, runner = _server(caplog, drift)
    cuts: list[tuple[int, ...]] = []
    sections_on = RowUpdates.sections_on

    def counting(updates: RowUpdates, device_packed):
        if device_packed is not updates.packed:  # a device copy, not the host's inspection
            cuts.append(updates.segment_sizes)
        return sections_on(updates, device_packed)

    monkeypatch.setattr(RowUpdates, "sections_on", counting)
    for index in range(4):
        request = SimulatedRequest(rid=f"q{index}", prompt=list(range(100 * index + 1,
                                                                      100 * index + 6)),
                                   max_new_tokens=2)
        server.admit(request)
        if index == 3:
            drift.step, drift.row, drift.delta = server.forwards, 0, 1
        server.extend([(request, 5)])
        server.decode([request])
        server.finish(request)
    assert len(cuts) == len(set(cuts)) == 1
    (row,) = _rows(caplog, runner)
    assert (row.reasons, row.step, row.stored_chain, row.expected_chain) == (
        int(Reason.VERIFY_SEQ_LENS), drift.step, 6, 5
    )


def test_the_live_row_count_goes_up_with_the_mirror(caplog) -> None:
    """The head of the upload area is the batch's row count, uploaded with its seq_lens: a
    replayed graph's padded rows lie past it."""
    server, runner = _server(caplog, _Drift())
    requests = _requests(server, [5, 3, 4])
    server.extend([(r, len(r.prompt)) for r in requests])
    assert runner.uploader.live_rows.tolist() == [3]
    server.decode(requests[:1], padded_rows=3)
    assert runner.uploader.live_rows.tolist() == [1]
    assert runner.uploader.seq_lens_mirror[:1].tolist() == [6]
    assert _rows(caplog, runner) == []


def test_stale_padded_rows_are_reported_and_leave_the_live_rows_alone(caplog) -> None:
    """Padded graph rows that carry live requests' rows (SGLang 0.5.12 without the padded-row
    fix): one ``padded_row`` per padded row and forward, position = its batch row, expected
    chain = the live row count; nothing else, then and in later forwards (the live requests'
    owner chains were not touched)."""
    server, runner = _server(caplog, _Drift())
    requests = _requests(server, [5, 3, 4])
    server.extend([(r, len(r.prompt)) for r in requests])
    server.decode(requests)
    step = server.forwards
    server.decode(requests[:2], padded_rows=2, stale_padding=True)
    rows = _rows(caplog, runner)
    assert sorted((r.check, r.reasons, r.req_pool_idx, r.slot, r.position, r.expected_chain,
                   r.step) for r in rows) == sorted(
        (CheckKind.PRE_VERIFY, int(Reason.PADDED_ROW), requests[b % 2].req_pool_idx, 0, b, 2,
         step)
        for b in (2, 3)
    )
    server.decode(requests)
    server.decode(requests)
    assert _rows(caplog, runner) == rows  # nothing new


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
