"""Real ``python -m sglang.launch_server`` servers side by side on one machine, and what their
logs say.

Servers are started through the package's own launcher
(:func:`sglang.srt.kv_canary.tools.server.start_server`: its own process group, a free port,
bounded waits, the whole group killed on stop). Every server of a run gets the same flags but
those its configuration adds (:func:`server_args`): the model's
(:attr:`.models.ModelShape.server_args`), :data:`COMMON_ARGS`, the machine's (``--machine-args``,
by default :data:`MACHINE_ARGS`), then the configuration's (:attr:`.configs.BenchConfig.flags`;
``launch_server`` keeps a repeated flag's last value). While others are measured a server is
paused (``SIGSTOP`` to its process group, :meth:`StartedServer.pause`).

:data:`MACHINE_ARGS` replace SGLang defaults that cannot run on the offline GPU host this
project measures on (its SGLang bundle has no FA3 kernels and no xgrammar, and flashinfer's
attention and sampling kernels compile with nvcc for minutes at start-up): Triton attention, the
PyTorch sampler, no grammar backend. On a machine where SGLang's own defaults run, pass
``--machine-args ''``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import signal
import time
from dataclasses import dataclass

from sglang.srt.kv_canary.tools.canary_log import parse_canary_log
from sglang.srt.kv_canary.tools.server import (
    RunningServer,
    ServerLaunch,
    ServerStartError,
    start_server,
)

from .configs import BenchConfig
from .deadline import Deadline
from .models import ModelShape
from .results import nvidia_smi
from .workloads import Workload

MACHINE_ARGS: tuple[str, ...] = ("--attention-backend", "triton", "--sampling-backend", "pytorch",
                                 "--grammar-backend", "none")
# Decode graphs up to batch 64 (the largest workload batch) instead of SGLang's default list up
# to a few hundred: a shorter start-up, the same graphs for every workload.
COMMON_ARGS: tuple[str, ...] = ("--cuda-graph-max-bs", "64")
READY_TIMEOUT_S = 400.0
_REASON_CHARS = 240
_ERROR_LINE = re.compile(r"^((?:\w+\.)*\w*(?:Error|Exception)): (.+)$")
_CANARY_ERROR_LINE = re.compile(r"\b(Canary\w*Error): (.+)$")
_POOL_FIELDS = {"kv_tokens": re.compile(r"\bmax_total_num_tokens=(\d+)"),
                "max_running_requests": re.compile(r"\bmax_running_requests=(\d+)"),
                "context_len": re.compile(r"\bcontext_len=(\d+)"),
                # SGLang's HybridSWAPoolConfigurator: "Use sliding window memory pool.
                # full_layer_tokens=..., swa_layer_tokens=..."
                "swa_kv_tokens": re.compile(r"\bswa_layer_tokens=(\d+)")}
PIECEWISE_CAPTURED = "Capture piecewise CUDA graph end"
_PLUGIN_LOADED = re.compile(r"Loaded plugin kv_canary\b|Executed general plugin: kv_canary\b")
_PLUGIN_SKIPPED = re.compile(r"Skipping plugin kv_canary\b")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    """One server of a run: a model served in one configuration."""

    model: ModelShape
    config: BenchConfig

    @property
    def label(self) -> str:
        return f"{self.model.name}/{self.config.name}"


def server_args(*, spec: ServerSpec, machine_args: tuple[str, ...]) -> tuple[str, ...]:
    """The ``launch_server`` flags of ``spec``'s server (the launcher adds the model path, host
    and port)."""
    return (*spec.model.server_args, *COMMON_ARGS, *machine_args, *spec.config.flags)


def server_launch(*, spec: ServerSpec, model_dir: pathlib.Path, log_dir: pathlib.Path,
                  machine_args: tuple[str, ...], ready_timeout_s: float,
                  server_module: str) -> ServerLaunch:
    """How ``spec``'s server is launched: its flags, its configuration's environment over a
    clean one (no ``SGLANG_KV_CANARY_*`` of this shell), its log named after the label."""
    log_name = re.sub(r"[^A-Za-z0-9._-]", "_", spec.label) + ".log"
    return ServerLaunch(model_dir=model_dir, log_path=log_dir / log_name, env=spec.config.env,
                        base_args=(), args=server_args(spec=spec, machine_args=machine_args),
                        inherit_canary_env=False, ready_timeout_s=ready_timeout_s,
                        server_module=server_module)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLimits:
    """What the server logged of its pools (None: not in the log).

    Attributes:
        kv_tokens: the KV pool's tokens (of a hybrid sliding-window model: its full-attention
            layers' pool).
        swa_kv_tokens: a hybrid sliding-window model's pool of its sliding-window layers
            (None: no such pool).
    """

    kv_tokens: int | None
    max_running_requests: int | None
    context_len: int | None
    swa_kv_tokens: int | None

    def describe(self) -> str:
        swa = "" if self.swa_kv_tokens is None else f", SWA pool {self.swa_kv_tokens} tokens"
        return f"KV pool {self.kv_tokens} tokens{swa}"


def read_pool_limits(log_text: str) -> PoolLimits:
    """The last ``max_total_num_tokens=``, ``max_running_requests=``, ``context_len=`` and
    ``swa_layer_tokens=`` of a server log."""
    found: dict[str, int | None] = {}
    for name, pattern in _POOL_FIELDS.items():
        values = pattern.findall(log_text)
        found[name] = int(values[-1]) if values else None
    return PoolLimits(**found)


def pool_problem(*, model: ModelShape, limits: PoolLimits) -> str | None:
    """What contradicts ``model`` in the pools a ready server logged (None: nothing): a hybrid
    sliding-window model served without SGLang's sliding-window pool."""
    if model.hybrid_swa and limits.swa_kv_tokens is None:
        return ("no sliding-window pool in its log (no swa_layer_tokens= line): not served on "
                "SGLang's hybrid SWA pool")
    return None


def misfit(*, workload: Workload, limits: PoolLimits) -> str | None:
    """Why ``workload`` cannot run as one batch on a server with ``limits`` (None: it fits, or
    a limit is unknown). A hybrid model's sliding-window pool is not compared: SGLang frees a
    request's SWA slots below its window, so a batch holds fewer of them than ``kv_tokens``."""
    if limits.kv_tokens is not None and limits.kv_tokens < workload.kv_tokens:
        return f"does not fit: KV pool {limits.kv_tokens} tokens < {workload.kv_tokens} needed"
    if (limits.max_running_requests is not None
            and limits.max_running_requests < workload.num_requests):
        return (f"does not fit: max_running_requests {limits.max_running_requests} < "
                f"{workload.num_requests}")
    if limits.context_len is not None and limits.context_len < workload.context_tokens:
        return f"does not fit: context {limits.context_len} < {workload.context_tokens} tokens"
    return None


def refusal_reason(*, log_text: str, fallback: str) -> str:
    """Why a server stopped during start-up: the canary's error line if the log has one, else
    the first ``SomeError: message`` line (a traceback's last), else ``fallback``'s first line."""
    lines = [line.strip("\r") for line in log_text.splitlines()]
    for pattern in (_CANARY_ERROR_LINE, _ERROR_LINE):
        for line in lines:
            if match := pattern.search(line):
                return f"{match.group(1)}: {match.group(2)}"[:_REASON_CHARS]
    return (fallback.splitlines() or ["no reason given"])[0][:_REASON_CHARS]


@dataclass(frozen=True, slots=True, kw_only=True)
class LogReport:
    """What a server's log says of the plugin, piecewise CUDA graphs and the canary.

    Attributes:
        plugin: ``loaded``, ``not loaded`` or ``unknown`` (the loader logged neither).
        piecewise_cuda_graph: whether SGLang logged the end of a piecewise CUDA-graph capture.
        canary_running: whether the canary logged its start-up line in the configured mode.
        tokens_checked: the latest stats line's count (None: no stats line).
        violations: violation lines logged.
    """

    plugin: str
    piecewise_cuda_graph: bool
    canary_running: bool
    tokens_checked: int | None
    violations: int

    def describe(self) -> str:
        parts = [f"plugin {self.plugin}"] if self.plugin != "unknown" else []
        parts.append("piecewise CUDA graph " + ("captured" if self.piecewise_cuda_graph
                                                else "off"))
        if self.canary_running:
            checked = ("no stats line" if self.tokens_checked is None
                       else f"{self.tokens_checked} tokens checked")
            parts.append(f"canary on, {checked}, {self.violations} violations")
        return ", ".join(parts)

    def problems(self, config: BenchConfig) -> list[str]:
        """What contradicts ``config``: a canary that should run and did not, violations, a
        canary or a plugin where none should be."""
        found = []
        if config.canary_on and not self.canary_running:
            found.append("the canary did not start (no start-up line in its mode)")
        if not config.canary_on and self.canary_running:
            found.append("a canary ran in a configuration without one")
        if self.violations:
            found.append(f"{self.violations} canary violation lines")
        if not config.plugin_loaded and self.plugin == "loaded":
            found.append("the plugin was loaded in a configuration without it")
        return found

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def read_log_report(*, config: BenchConfig, log_text: str) -> LogReport:
    """The :class:`LogReport` of a server of ``config``."""
    summary = parse_canary_log(log_text)
    mode = config.env.get("SGLANG_KV_CANARY_MODE")
    latest = summary.latest_stats
    if _PLUGIN_LOADED.search(log_text):
        plugin = "loaded"
    elif _PLUGIN_SKIPPED.search(log_text):
        plugin = "not loaded"
    else:
        plugin = "unknown"
    return LogReport(
        plugin=plugin,
        piecewise_cuda_graph=PIECEWISE_CAPTURED in log_text,
        canary_running=any(mode is None or line.fields.get("mode") == mode
                           for line in summary.startup),
        tokens_checked=None if latest is None else latest.counts.get("tokens", 0),
        violations=len(summary.violations),
    )


@dataclass(slots=True, kw_only=True)
class StartedServer:
    """One launched server of a run (mutable bookkeeping while the run goes on).

    ``status``: ``starting``, ``ready``, ``refused: ...`` (it stopped during start-up),
    ``failed: ...`` (not ready in time, or a round failed), ``stopped``.
    """

    spec: ServerSpec
    launch: ServerLaunch
    server: RunningServer
    launched_at: float  # time.monotonic() when it was started
    status: str = "starting"
    ready_s: float = 0.0  # launch to ready
    limits: PoolLimits | None = None
    log_report: LogReport | None = None

    @property
    def live(self) -> bool:
        return self.status == "ready"

    def fail(self, reason: str) -> None:
        self.status = f"failed: {reason.splitlines()[0][:_REASON_CHARS]}"

    def wait_ready(self, *, deadline: Deadline) -> None:
        """Wait until the server answers ``/health`` or the deadline passes; sets ``status``,
        ``ready_s`` and ``limits``."""
        bound = max(deadline.remaining_s(), 1.0)
        try:
            self.server.wait_ready(bound)
        except ServerStartError as error:
            if self.server.returncode is None:
                self.status = f"failed: not ready within the time budget ({bound:.0f} s)"
            else:
                self.status = "refused: " + refusal_reason(log_text=self.server.log_text(),
                                                           fallback=str(error))
            return
        self.status = "ready"
        self.ready_s = time.monotonic() - self.launched_at
        self.limits = read_pool_limits(self.server.log_text())

    def pause(self) -> None:
        """Stop every process of the server (``SIGSTOP`` to its group): an idle SGLang scheduler
        polls for requests without pause, and a paused one takes no CPU from the server being
        measured. A server that is not ready is left alone."""
        if self.live:
            self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a paused server (``SIGCONT``; harmless on one that runs)."""
        self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pgid, number)

    def stop(self) -> None:
        """Read the log's report, then stop the whole process group (idempotent)."""
        self.resume()  # a stopped process would hold SIGTERM until continued
        if self.log_report is None:
            self.log_report = read_log_report(config=self.spec.config,
                                              log_text=self.server.log_text())
        self.server.stop()
        if self.live:
            self.status = "stopped"

    def to_json(self) -> dict[str, object]:
        return {"label": self.spec.label, "status": self.status, "ready_s": self.ready_s,
                "command": self.launch.command(port=self.server.port),
                "log_path": str(self.launch.log_path),
                "pool": None if self.limits is None else dataclasses.asdict(self.limits),
                "log": None if self.log_report is None else self.log_report.to_json()}


def start_servers(specs: list[ServerSpec], *, model_dirs: dict[str, pathlib.Path],
                  log_dir: pathlib.Path, machine_args: tuple[str, ...],
                  stack: contextlib.ExitStack,
                  server_module: str = "sglang.launch_server") -> list[StartedServer]:
    """Start every server of ``specs`` at once (none is waited for); each is stopped when
    ``stack`` closes."""
    started = []
    for spec in specs:
        launch = server_launch(spec=spec, model_dir=model_dirs[spec.model.name], log_dir=log_dir,
                               machine_args=machine_args, ready_timeout_s=READY_TIMEOUT_S,
                               server_module=server_module)
        entry = StartedServer(spec=spec, launch=launch, server=start_server(launch),
                              launched_at=time.monotonic())
        stack.callback(entry.stop)
        started.append(entry)
    return started


def gpu_memory_used() -> str:
    """``used, total`` memory of every GPU as ``nvidia-smi`` reports it, or ``unknown``."""
    return "; ".join(nvidia_smi(query="memory.used,memory.total")) or "unknown"
