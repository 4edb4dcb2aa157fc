"""The server benchmark's result set of one model: its tables, target verdicts and JSON.

Per workload and configuration: the median figure over the measured rounds (stock's printed in
its unit), the ratio to stock paired by round, and, for a canary configuration, the ratio to
``off+flags`` paired by round (the canary's own cost, with the flags it needs already in the
baseline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .configs import CONFIGS, FLAGS_BASELINE, STOCK
from .interleave import Interleaved
from .models import ModelShape
from .results import describe_machine
from .servers import StartedServer
from .stats import Spread, paired_ratios, spread
from .table import Table, ratio_cell, value_cell
from .targets import Verdict
from .workloads import METRICS, Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One configuration on one workload: its figure, its ratio to stock and (canary
    configurations) to ``off+flags``; None where not measured."""

    value: Spread | None
    vs_stock: Spread | None
    vs_flags: Spread | None

    def to_json(self) -> dict[str, object]:
        return {name: None if figure is None else figure.to_json()
                for name, figure in (("value", self.value), ("vs_stock", self.vs_stock),
                                     (f"vs_{FLAGS_BASELINE}", self.vs_flags))}


def _paired(interleaved: Interleaved, *, workload: Workload, label: str,
            baseline: str) -> Spread | None:
    mine = interleaved.series(label=label, workload=workload.name)
    theirs = interleaved.series(label=baseline, workload=workload.name)
    common = sorted(set(mine) & set(theirs))
    if not common:
        return None
    return paired_ratios(numerators=[mine[k].value(workload.metric) for k in common],
                         denominators=[theirs[k].value(workload.metric) for k in common])


def workload_cells(*, interleaved: Interleaved, workload: Workload,
                   configs: Sequence[str]) -> dict[str, Cell]:
    """Every configuration's :class:`Cell` on ``workload`` (participants are labelled by
    configuration name)."""
    cells = {}
    for name in configs:
        series = interleaved.series(label=name, workload=workload.name)
        values = [timing.value(workload.metric) for timing in series.values()]
        cells[name] = Cell(
            value=spread(values) if values else None,
            vs_stock=_paired(interleaved, workload=workload, label=name, baseline=STOCK),
            vs_flags=(_paired(interleaved, workload=workload, label=name,
                              baseline=FLAGS_BASELINE) if CONFIGS[name].canary_on else None),
        )
    return cells


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelReport:
    """Everything the server benchmark reports of one model."""

    model: ModelShape
    configs: tuple[str, ...]
    workloads: tuple[Workload, ...]
    cells: Mapping[str, Mapping[str, Cell]]  # workload -> configuration -> cell
    verdicts: tuple[Verdict, ...]
    interleaved: Interleaved
    servers: tuple[StartedServer, ...]
    problems: tuple[str, ...]


def build_report(*, model: ModelShape, configs: Sequence[str], workloads: Sequence[Workload],
                 interleaved: Interleaved, servers: Sequence[StartedServer],
                 problems: Sequence[str]) -> ModelReport:
    """The report of one model's measured servers (``problems``: what the run found wrong so
    far; a stock baseline that measured nothing is added)."""
    cells = {workload.name: workload_cells(interleaved=interleaved, workload=workload,
                                           configs=configs) for workload in workloads}
    verdicts = tuple(
        Verdict(target=target, ratio=cells[target.workload][target.config].vs_stock)
        for target in model.targets
        if target.workload in cells and target.config in configs)
    found = list(problems)
    if STOCK in configs and not interleaved.rounds.get(STOCK):
        found.append(f"{model.name}: stock measured no round: no ratio has its baseline")
    return ModelReport(model=model, configs=tuple(configs), workloads=tuple(workloads),
                       cells=cells, verdicts=verdicts, interleaved=interleaved,
                       servers=tuple(servers), problems=tuple(found))


def _ratio_table(report: ModelReport, *, columns: Sequence[str], stock_value: bool,
                 versus_flags: bool) -> Table:
    rows = []
    for workload in report.workloads:
        metric = METRICS[workload.metric]
        row = [workload.name, metric.label]
        for name in columns:
            cell = report.cells[workload.name][name]
            if stock_value and name == STOCK:
                row.append(value_cell(cell.value, digits=metric.digits))
            else:
                row.append(ratio_cell(cell.vs_flags if versus_flags else cell.vs_stock))
        rows.append(tuple(row))
    return Table(header=("workload", "metric", *columns), rows=tuple(rows), label_columns=2)


def format_report(report: ModelReport, *, machine: Mapping[str, object],
                  flags: Sequence[str]) -> str:
    """The short text of one model's result set."""
    run = report.interleaved
    lines = [f"server-{report.model.name}: {report.model.describe()}",
             f"machine: {describe_machine(machine)}",
             "every server: " + " ".join(flags) + "; then its configuration's flags",
             "configurations: " + "; ".join(f"{name} = {CONFIGS[name].summary}"
                                            for name in report.configs),
             f"{run.sweeps} measured rounds per workload, interleaved (each round runs every "
             f"configuration within seconds; stopped by: {run.stopped}); warm-up sweep "
             f"{run.warm_up_s:.0f} s, longest sweep {run.longest_sweep_s:.0f} s",
             "", "x stock: each configuration over stock in the same round: median over rounds ± "
             "half their interquartile range; stock: its own figure, median ± half the "
             "interquartile range in %"]
    lines[:0] = [f"!!! PROBLEM: {problem}" for problem in report.problems]
    lines.append(_ratio_table(report, columns=report.configs, stock_value=True,
                              versus_flags=False).render(indent="  "))
    canaries = [name for name in report.configs if CONFIGS[name].canary_on]
    if canaries and FLAGS_BASELINE in report.configs:
        lines += ["", f"the canary's own cost: each canary configuration over {FLAGS_BASELINE} "
                      "in the same round",
                  _ratio_table(report, columns=canaries, stock_value=False,
                               versus_flags=True).render(indent="  ")]
    if report.verdicts:
        lines += ["", "targets (vs stock):"]
        lines += [f"  {verdict.describe()}" for verdict in report.verdicts]
    lines += ["", "servers:"]
    for entry in report.servers:
        pool = "" if entry.limits is None else f", {entry.limits.describe()}"
        log = "" if entry.log_report is None else f"; {entry.log_report.describe()}"
        ready = f", ready in {entry.ready_s:.0f} s" if entry.ready_s else ""
        lines.append(f"  {entry.spec.config.name}: {entry.status}{ready}{pool}{log}")
    lines += [f"  note: {note}" for note in run.notes]
    lines += [f"!!! PROBLEM: {problem}" for problem in report.problems]
    return "\n".join(lines)


def report_json(report: ModelReport, *, machine: Mapping[str, object],
                options: Mapping[str, object]) -> dict[str, object]:
    """Every number of one model's result set, the settings and the machine."""
    run = report.interleaved
    return {
        "benchmark": "server",
        "model": report.model.name,
        "shape": report.model.to_json(),
        "machine": dict(machine),
        "options": dict(options),
        "configs": {name: CONFIGS[name].to_json() for name in report.configs},
        "workloads": {workload.name: workload.to_json() for workload in report.workloads},
        "servers": [entry.to_json() for entry in report.servers],
        "interleaving": {"sweeps": run.sweeps, "warm_up_s": run.warm_up_s,
                         "longest_sweep_s": run.longest_sweep_s, "stopped": run.stopped,
                         "notes": list(run.notes)},
        "rounds": {label: {workload: {str(index): timing.to_json()
                                      for index, timing in series.items()}
                           for workload, series in by_workload.items()}
                   for label, by_workload in run.rounds.items()},
        "table": {workload: {name: cell.to_json() for name, cell in cells.items()}
                  for workload, cells in report.cells.items()},
        "targets": [verdict.to_json() for verdict in report.verdicts],
        "problems": list(report.problems),
    }
