"""Building the components of one canary once its KV pool exists, with explicit dependencies.

:func:`build_pool_components` is what ``CanaryRunner.on_memory_pool`` does: the pool seam for the
model runner's pools, the device state beside them, and every component that reads or writes
that state (:class:`PoolComponents`); :func:`installed_line` describes them in the start-up log.
With ``SGLANG_KV_CANARY_REPORT_PATH`` set, also the report file and the forward history it reads
(:func:`_report_parts`; their modules are imported only then); abort mode
(``SGLANG_KV_CANARY_ON_VIOLATION=abort``) keeps the forward history too, and an inbox of the rows
its containment has not acted on yet. With ``--enable-metrics``, also
the prometheus metrics (:func:`_metrics`; prometheus_client is imported only then).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.monitor.monitor import CanaryMonitor
from sglang.srt.kv_canary.monitor.report_sinks import combine_sinks
from sglang.srt.kv_canary.perturb.injector import FaultInjector, build_fault_injector
from sglang.srt.kv_canary.pools import canary_pool_for
from sglang.srt.kv_canary.pools.seam import PoolContext
from sglang.srt.kv_canary.pools.seam import CanaryPool
from sglang.srt.kv_canary.runner.device_state import allocate_device_state
from sglang.srt.kv_canary.runner.kernels import CanaryKernels
from sglang.srt.kv_canary.runner.launch_accounting import LaunchAccounting
from sglang.srt.kv_canary.runner.memory_budget import (
    UPLOAD_STAGING_WORDS,
    FixedBuffers,
    graph_max_bs_bound,
    max_tokens_per_forward,
    per_token_bytes,
    seq_lens_mirror_rows,
    uniform_block_rows,
)
from sglang.srt.kv_canary.runner.request_rows import RequestRows
from sglang.srt.kv_canary.runner.row_uploader import RowUploader
from sglang.srt.kv_canary.runner.speculative import SpeculativeCanary
from sglang.srt.kv_canary.runner.token_checks import TokenChecks
from sglang.srt.kv_canary.runner.upload_buffers import (
    UPLOAD_BUFFER_SLOTS,
    UPLOAD_BUFFER_WORDS,
    UploadBufferRing,
)
from sglang.srt.kv_canary.token_history.history import TokenHistory
from sglang.srt.kv_canary.token_history.write_expectations import WriteExpectations
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager

if TYPE_CHECKING:
    from sglang.srt.kv_canary.containment.inbox import ContainmentInbox
    from sglang.srt.kv_canary.monitor.forward_history import ForwardHistory
    from sglang.srt.kv_canary.monitor.metrics import CanaryMetrics
    from sglang.srt.kv_canary.monitor.report_file import ViolationReportFile

DRAFT_POOL = "draft"  # the EAGLE draft canary's pool, in its lines and report-file objects
TARGET_POOL = "target"  # the target model's canary, in its metrics' pool label
# ends the EAGLE draft canary's violation / health / stats lines
DRAFT_LINE_SUFFIX = f" pool={DRAFT_POOL}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolComponents:
    """The components of one canary that exist once its KV pool does."""

    pool: CanaryPool
    state: CanaryDeviceState
    token_checks: TokenChecks | None  # None with both token checks off
    request_rows: RequestRows
    uploader: RowUploader
    speculative: SpeculativeCanary | None  # None without EAGLE
    monitor: CanaryMonitor
    injector: FaultInjector | None  # None without faults, and on an EAGLE draft model's canary
    # the forwards' modes, batch sizes and request rows' owners (None without the report file)
    forward_history: ForwardHistory | None = None
    report_file: ViolationReportFile | None = None  # None without the report file
    metrics: CanaryMetrics | None = None  # None without --enable-metrics
    # the rows abort mode's containment has not acted on yet (None outside abort mode)
    containment_inbox: ContainmentInbox | None = None


def build_pool_components(
    *,
    config: CanaryConfig,
    model_runner: Any,
    kernels: CanaryKernels,
    oracle: TokenOracleManager | None,
    accounting: LaunchAccounting,
    device: torch.device,
) -> PoolComponents:
    """The canary's components beside ``model_runner``'s pools (read, never changed).

    Raises:
        CanaryUnsupportedError: the pools are not ones the canary covers, or their real-data
            buffers cannot be fingerprinted.
        RuntimeError: the write-input assert is on but no oracle is installed.
        ReportFileError: the report file cannot be opened or written.
    """
    is_draft = bool(getattr(model_runner, "is_draft_worker", False))
    server_args = model_runner.server_args
    req_to_token = model_runner.req_to_token_pool.req_to_token
    pool = canary_pool_for(
        req_to_token_pool=model_runner.req_to_token_pool,
        token_to_kv_pool=model_runner.token_to_kv_pool,
        context=PoolContext(
            sliding_window_size=getattr(model_runner, "sliding_window_size", None),
            attention_backends=tuple(server_args.get_attention_backends()),
        ),
    )
    state = allocate_device_state(config=config, pool=pool, req_to_token=req_to_token)
    rows, columns = req_to_token.shape
    speculative = server_args.speculative_algorithm is not None
    pin_memory = device.type == "cuda"
    token_checks = None
    if config.token_history_enabled:
        token_checks = TokenChecks(
            history=TokenHistory(
                num_rows=rows, max_context_len=columns, device=device,
                scatter=kernels.scatter_req_token_ids,
                bind_append=kernels.bind_append_history_tokens,
            ),
            expectations=_write_expectations(config=config, model_runner=model_runner,
                                             oracle=oracle, is_draft=is_draft, device=device),
            oracle=oracle,
            verify_token=config.enable_verify_token_assert,
            appends_sampled=not speculative,
            device=device,
        )
    ring = UploadBufferRing(slots=UPLOAD_BUFFER_SLOTS, words=UPLOAD_BUFFER_WORDS,
                            pin_memory=pin_memory)
    request_rows = RequestRows(
        num_rows=rows, token_history=token_checks is not None, owner_chains=True,
        pin_memory=pin_memory, history_tails=speculative, history_offset=1 if is_draft else 0,
        upload_buffers=ring,
    )
    uploader = RowUploader(
        state=state, request_rows=request_rows,
        token_history=None if token_checks is None else token_checks.history,
        admission_check=kernels.admission_owner_check, ring=ring,
        mirror_rows=seq_lens_mirror_rows(server_args, request_rows=rows),
        staging_words=UPLOAD_STAGING_WORDS, device=device,
    )
    speculative_canary = None
    if speculative:
        speculative_canary = SpeculativeCanary(
            state=state, accounting=accounting,
            accepted_owner_resync=kernels.accepted_owner_resync,
            block_rows=uniform_block_rows(request_rows=rows,
                                          graph_max_bs=graph_max_bs_bound(server_args)),
            draft_tokens=server_args.speculative_num_draft_tokens,
            is_draft=is_draft,
            reinject_padded_row_bug=config.reinject_padded_row_bug,
        )
    history, report_file = _report_parts(config=config, model_runner=model_runner, pool=pool,
                                         state=state, is_draft=is_draft)
    metrics = _metrics(model_runner=model_runner, is_draft=is_draft)
    inbox = None
    if config.mode is CanaryMode.ABORT:
        from sglang.srt.kv_canary.containment.inbox import ContainmentInbox

        inbox = ContainmentInbox()
    monitor = CanaryMonitor(state=state, config=config, seal=kernels.publish_counters,
                            line_suffix=DRAFT_LINE_SUFFIX if is_draft else "",
                            report_sink=combine_sinks(sinks=(report_file, metrics, inbox)),
                            metrics=metrics)
    # faults are injected into the target model's forwards (the draft canary checks its own
    # pool and reports with DRAFT_LINE_SUFFIX)
    injector = None if is_draft else build_fault_injector(
        config=config.perturb, state=state, pool=pool,
        vocab_size=model_runner.model_config.vocab_size,
    )
    return PoolComponents(pool=pool, state=state, token_checks=token_checks,
                          request_rows=request_rows, uploader=uploader,
                          speculative=speculative_canary, monitor=monitor, injector=injector,
                          forward_history=history, report_file=report_file, metrics=metrics,
                          containment_inbox=inbox)


def _report_parts(
    *, config: CanaryConfig, model_runner: Any, pool: CanaryPool, state: CanaryDeviceState,
    is_draft: bool,
) -> tuple[ForwardHistory | None, ViolationReportFile | None]:
    """The forward history and the report file (header written), or ``(None, None)`` without
    ``SGLANG_KV_CANARY_REPORT_PATH`` (nothing imported then); abort mode keeps the history
    without the file too (its containment maps rows to requests with it).

    Raises:
        ReportFileError: the file cannot be opened or written.
    """
    abort_mode = config.mode is CanaryMode.ABORT
    if config.report_path is None and not abort_mode:
        return None, None
    from sglang.srt.kv_canary.monitor.forward_history import ForwardHistory

    history = ForwardHistory()
    if config.report_path is None:
        return history, None
    from sglang.srt.kv_canary.monitor.report_file import open_report_file

    report_file = open_report_file(
        config=config, history=history, pool=DRAFT_POOL if is_draft else None,
        pool_description=pool.describe(), ring_capacity=state.ring_capacity,
        tp_rank=getattr(model_runner, "tp_rank", None),
    )
    return history, report_file


def _metrics(*, model_runner: Any, is_draft: bool) -> CanaryMetrics | None:
    """The canary's prometheus metrics, labeled like the scheduler's own (its ranks from
    ``model_runner``), or None without ``server_args.enable_metrics`` (nothing imported then)."""
    if not model_runner.server_args.enable_metrics:
        return None
    from sglang.srt.kv_canary.monitor.metrics import build_canary_metrics

    return build_canary_metrics(
        server_args=model_runner.server_args, pool=DRAFT_POOL if is_draft else TARGET_POOL,
        tp_rank=model_runner.tp_rank, pp_rank=model_runner.pp_rank,
        moe_ep_rank=model_runner.moe_ep_rank, dp_rank=model_runner.dp_rank,
    )


def _write_expectations(
    *, config: CanaryConfig, model_runner: Any, oracle: TokenOracleManager | None,
    is_draft: bool, device: torch.device,
) -> WriteExpectations | None:
    """The write-input assert's expectations (assert on, target model only: an EAGLE draft
    model's inputs are the next position's tokens or guesses).

    Raises:
        RuntimeError: the assert is on but no oracle is installed.
    """
    if not config.enable_write_input_assert or is_draft:
        return None
    if oracle is None:
        raise RuntimeError(
            "KV canary: SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT=1 compares inputs with "
            "the token oracle, but no oracle is installed on this ModelRunner"
        )
    return WriteExpectations(
        oracle=oracle,
        capacity=max_tokens_per_forward(model_runner.server_args,
                                        max_running_requests=model_runner.max_running_requests),
        device=device,
    )


def installed_line(*, parts: PoolComponents, config: CanaryConfig, kernels: CanaryKernels,
                   reserved: FixedBuffers, is_draft: bool) -> str:
    """The start-up line that says what the canary of one model runner keeps and checks."""
    state = parts.state
    real_data = "off"
    if state.real_data is not None:
        real_data = f"{config.real_data.value} ({len(state.real_data.sources)} sources per slot)"
    token_checks = "token checks off" if parts.token_checks is None \
        else parts.token_checks.describe()
    if is_draft and config.enable_write_input_assert:
        token_checks += " (EAGLE draft model: the write-input assert checks the target's)"
    pool = (
        " on the EAGLE draft model's pool (slot p holds the token at p + 1; its lines end "
        f"with '{DRAFT_LINE_SUFFIX.strip()}')" if is_draft else ""
    )
    report = "" if parts.report_file is None else f", report file {parts.report_file.path}"
    report += "" if parts.metrics is None else ", prometheus metrics kv_canary_*"
    return (
        f"KV canary installed{pool}: records {RECORD_BYTES} B/slot x {state.num_slots} slots = "
        f"{state.num_slots * RECORD_BYTES / 2**20:.2f} MiB (pool {parts.pool.describe()}), "
        f"violation ring {state.ring_capacity} rows, real data {real_data}, "
        f"{token_checks}, kernels {kernels.backend.value}, device {state.device}{report}; "
        f"memory from the KV budget: {per_token_bytes()} B/token added to the KV cell "
        f"size, fixed buffers reserved {reserved.describe()}"
    )
