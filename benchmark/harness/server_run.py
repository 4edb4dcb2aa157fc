"""One run of the server benchmark: every server of every model started at once, then each
model measured in turn (its servers interleaved, :mod:`.interleave`) and stopped, all within one
time budget.

Budget: the servers must be ready by the deadline less what measuring needs at least
(:data:`MIN_MEASURE_S` per model); a server not ready by then is reported ``failed``. Once they
are, the time left (less :data:`STOP_RESERVE_S` per model for stopping its servers) is shared
over the models in proportion to their ``time_share``; a model that ends early leaves its time
to the next. Each model's result set is written as soon as it is measured.

Every server is paused (``SIGSTOP``) once all are ready and runs only for its own rounds
(:class:`.interleave.Participant`): an idle SGLang scheduler polls for work without pause, and
nine of them would share the machine with the one being measured.
"""

from __future__ import annotations

import contextlib
import pathlib
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .configs import CONFIGS
from .deadline import Deadline
from .interleave import Participant, measure_interleaved
from .models import MODELS, ModelShape, make_model
from .server_report import ModelReport, build_report
from .servers import (
    ServerSpec,
    StartedServer,
    gpu_memory_used,
    misfit,
    pool_problem,
    start_servers,
)
from .workloads import WORKLOADS, RoundTiming, Workload, run_round

MIN_MEASURE_S = 45.0
STOP_RESERVE_S = 20.0
ROUND_TIMEOUT_S = 60.0  # bound of each wait for the server's next streamed line


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerRun:
    """What one run measures and how.

    Attributes:
        models, configs, workloads: names, in run order (models) and table order.
        max_rounds: measured rounds per workload at most (fewer when the budget ends first).
        time_budget_s: the whole run, server start-ups and stops included.
        machine_args: flags every server gets in place of SGLang defaults the machine cannot
            run (:data:`.servers.MACHINE_ARGS`).
        log_dir: where the server logs go.
        pause_idle: keep every server paused (``SIGSTOP``) but the one being measured.
        server_module: run with ``python -m`` to launch a server (a stand-in in tests).
    """

    models: tuple[str, ...]
    configs: tuple[str, ...]
    workloads: tuple[str, ...]
    max_rounds: int
    time_budget_s: float
    machine_args: tuple[str, ...]
    log_dir: pathlib.Path
    pause_idle: bool = True
    server_module: str = "sglang.launch_server"

    def to_json(self) -> dict[str, object]:
        return {"models": list(self.models), "configs": list(self.configs),
                "workloads": list(self.workloads), "max_rounds": self.max_rounds,
                "time_budget_s": self.time_budget_s, "machine_args": list(self.machine_args),
                "log_dir": str(self.log_dir), "pause_idle": self.pause_idle}


def _participant(entry: StartedServer, *, model: ModelShape, pause_idle: bool) -> Participant:
    def one_round(workload: Workload, round_index: int) -> RoundTiming:
        try:
            return run_round(entry.server, workload=workload, vocab_size=model.vocab_size,
                             round_index=round_index, timeout_s=ROUND_TIMEOUT_S)
        except RuntimeError as error:
            entry.fail(f"{workload.name} round {round_index}: {error}")
            raise

    def skip(workload: Workload) -> str | None:
        return None if entry.limits is None else misfit(workload=workload, limits=entry.limits)

    participant = Participant(label=entry.spec.config.name, run_round=one_round, skip=skip)
    if pause_idle:
        participant.resume, participant.pause = entry.resume, entry.pause
    return participant


def _server_problems(entries: Sequence[StartedServer]) -> list[str]:
    problems = []
    for entry in entries:
        if entry.status not in ("ready", "stopped"):
            problems.append(f"{entry.spec.label}: {entry.status} (log {entry.launch.log_path})")
        if entry.limits is not None and (
                problem := pool_problem(model=entry.spec.model, limits=entry.limits)):
            problems.append(f"{entry.spec.label}: {problem} (log {entry.launch.log_path})")
        if entry.log_report is not None:
            problems += [f"{entry.spec.label}: {problem} (log {entry.launch.log_path})"
                         for problem in entry.log_report.problems(entry.spec.config)]
    return problems


def run_servers(run: ServerRun, *, on_model: Callable[[ModelReport], None],
                say: Callable[[str], None] = print) -> list[ModelReport]:
    """Start, measure and stop every server of ``run``; ``on_model`` gets each model's report
    as soon as it is measured (to write its result set); every report, in model order."""
    deadline = Deadline.after(run.time_budget_s)
    models = [MODELS[name] for name in run.models]
    workloads = [WORKLOADS[name] for name in run.workloads]
    specs = [ServerSpec(model=model, config=CONFIGS[name])
             for model in models for name in run.configs]
    reports = []
    with tempfile.TemporaryDirectory(prefix="kv_canary_bench_models_") as root, \
            contextlib.ExitStack() as stack:
        model_dirs = {model.name: make_model(model, directory=pathlib.Path(root) / model.name)
                      for model in models}
        servers = start_servers(specs, model_dirs=model_dirs, log_dir=run.log_dir,
                                machine_args=run.machine_args, stack=stack,
                                server_module=run.server_module)
        say(f"started {len(servers)} servers at once; logs in {run.log_dir}")
        ready_by = deadline.earlier_by(len(models) * (MIN_MEASURE_S + STOP_RESERVE_S))
        for entry in servers:
            entry.wait_ready(deadline=ready_by)
            say(f"  {entry.spec.label}: {entry.status}"
                + (f" {entry.ready_s:.0f} s after its launch" if entry.live else ""))
        say(f"GPU memory with every server up: {gpu_memory_used()}")
        if run.pause_idle:
            for entry in servers:
                entry.pause()
        for position, model in enumerate(models):
            later = models[position + 1:]
            shares = model.time_share + sum(other.time_share for other in later)
            usable = deadline.remaining_s() - STOP_RESERVE_S * (1 + len(later))
            model_deadline = Deadline.after(max(usable * model.time_share / shares, 1e-3))
            own = [entry for entry in servers if entry.spec.model is model]
            participants = [_participant(entry, model=model, pause_idle=run.pause_idle)
                            for entry in own if entry.live]
            measured = measure_interleaved(participants=participants, workloads=workloads,
                                           deadline=model_deadline, max_rounds=run.max_rounds)
            for entry in own:
                entry.stop()
            say(f"[{model.name}] {measured.sweeps} rounds measured ({measured.stopped}); "
                "servers stopped")
            report = build_report(model=model, configs=run.configs, workloads=workloads,
                                  interleaved=measured, servers=own,
                                  problems=_server_problems(own))
            on_model(report)
            reports.append(report)
    return reports
