"""Results of ``bench_server_overhead.py`` and how they are compared and printed.

Every number of a table is a median over measured rounds; its noise is half the spread across
those rounds ((max - min) / 2, see ``timing.Spread``). A ratio's noise adds the two sides'
relative spreads (``timing.ratio``), an added-ms figure the two half-widths
(``timing.difference``). A configuration's row, and its baseline, pool the rounds of every
server of that configuration in the run (the first configuration of a run is started again at
its end; ``--cycles N`` starts every configuration N times, in turn), so drift between those
servers widens the spread; a later server's own row (``NAME#k``) compares it with the first
(``NAME#1``) and shows the drift itself. Pairs compare each server with its baseline's server
started just before it, which that slow drift does not enter.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from cpu_contention import CpuUse
from server_workloads import RoundTiming, Workload
from timing import Difference, Spread, difference, ratio, spread

MEASURED = "measured"

NOISE_NOTE = (
    "noise (the ± beside each figure): half of (max - min) across the measured rounds; for a "
    "ratio the two sides' relative spreads added, for +ms the two half-widths added. A "
    "configuration's row, and a baseline, pool the rounds of every server of that configuration "
    "in this run (the run's first configuration is started again at the end; with --cycles N "
    "every configuration has N servers, started in turn), so drift between those servers is part "
    "of its spread; NAME#k vs NAME#1 shows that drift.")


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadResult:
    """One workload on one server.

    Attributes:
        workload: the workload's name.
        status: ``measured`` (every round), ``partial: time budget`` (fewer rounds),
            ``skipped: <why>`` (no round; e.g. the KV pool is too small or no time was left).
        rounds: the measured rounds (empty when skipped).
        warm_up: the warm-up round (None when skipped).
        warm_up_s: the warm-up round's whole duration (flush and payload included).
        longest_round_s: the longest measured round's whole duration (0.0: none).
        The last two are the time budget's estimates for this workload on the next server.
        host_timers: the last host-timer line the server logged while this workload ran
            (``--host-timers``; "" when none was logged then).
        cpu: the steal and the scheduler's CPU time while the workload ran (its warm-up round
            included;
            :mod:`cpu_contention`; None where not read: servers measured together, files
            written before it).
    """

    workload: str
    status: str
    rounds: tuple[RoundTiming, ...] = ()
    warm_up: RoundTiming | None = None
    warm_up_s: float = 0.0
    longest_round_s: float = 0.0
    host_timers: str = ""
    cpu: CpuUse | None = None

    def to_json(self) -> dict[str, object]:
        return {"workload": self.workload, "status": self.status,
                "warm_up_s": self.warm_up_s, "longest_round_s": self.longest_round_s,
                "warm_up": None if self.warm_up is None else self.warm_up.to_json(),
                "rounds": [timing.to_json() for timing in self.rounds],
                "host_timers": self.host_timers,
                "cpu": None if self.cpu is None else self.cpu.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> WorkloadResult:
        """The result :meth:`to_json` wrote (``host_timers``: "", ``cpu``: None in files
        written before them)."""
        warm_up = data.get("warm_up")
        cpu = data.get("cpu")
        return cls(workload=str(data["workload"]), status=str(data["status"]),
                   rounds=tuple(RoundTiming.from_json(item) for item in data["rounds"]),
                   warm_up=None if warm_up is None else RoundTiming.from_json(warm_up),
                   warm_up_s=float(data["warm_up_s"]),
                   longest_round_s=float(data["longest_round_s"]),
                   host_timers=str(data.get("host_timers", "")),
                   cpu=None if cpu is None else CpuUse.from_json(cpu))


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigResult:
    """One server: a configuration, started once (``run`` 1) or again at the end of the run
    (``run`` 2).

    Attributes:
        config: the configuration's name.
        run: 1, or 2 for the second server of the run's first configuration.
        status: ``measured``, ``partial: ...`` (some rounds left out), ``refused: <reason>``
            (the server stopped at start-up), ``failed: <reason>`` or ``skipped: <reason>``.
        workloads: per workload name, what it measured (only workloads that were reached).
        server_note: what the server log says of the canary or of piecewise CUDA graphs.
        startup_s: launch to ready; duration_s: launch to stopped.
        command: the server's command line (empty when it was not started).
        log_path: the server's log file ("" when it was not started).
        kv_pool_tokens, max_running_requests: as the server logged them (None: not found).
        placement: where its processes ran (``--pin-scheduler``; "" when it was not started).
    """

    config: str
    status: str
    run: int = 1
    workloads: Mapping[str, WorkloadResult] = field(default_factory=dict)
    server_note: str = "-"
    startup_s: float = 0.0
    duration_s: float = 0.0
    command: tuple[str, ...] = ()
    log_path: str = ""
    kv_pool_tokens: int | None = None
    max_running_requests: int | None = None
    placement: str = ""

    @property
    def label(self) -> str:
        """``config``, or ``config#2`` for a second server of the same configuration."""
        return self.config if self.run == 1 else f"{self.config}#{self.run}"

    def to_json(self) -> dict[str, object]:
        return {"config": self.config, "run": self.run, "label": self.label,
                "status": self.status, "server_note": self.server_note,
                "startup_s": self.startup_s, "duration_s": self.duration_s,
                "command": list(self.command), "log_path": self.log_path,
                "kv_pool_tokens": self.kv_pool_tokens,
                "max_running_requests": self.max_running_requests,
                "placement": self.placement,
                "workloads": {name: result.to_json() for name, result in self.workloads.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ConfigResult:
        """The server :meth:`to_json` wrote (``placement``: "" in files written before it)."""
        return cls(config=str(data["config"]), status=str(data["status"]), run=int(data["run"]),
                   workloads={name: WorkloadResult.from_json(item)
                              for name, item in data["workloads"].items()},
                   server_note=str(data["server_note"]), startup_s=float(data["startup_s"]),
                   duration_s=float(data["duration_s"]), command=tuple(data["command"]),
                   log_path=str(data["log_path"]), kv_pool_tokens=data["kv_pool_tokens"],
                   max_running_requests=data["max_running_requests"],
                   placement=str(data.get("placement", "")))


# ----------------------------------------------------------------------------- comparisons

MetricName = Literal["tok_s", "ttft", "step_added_ms"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A bound on one configuration's figure vs its baseline.

    ``tok_s`` and ``ttft`` bound the ratio to the baseline (``at_most`` False: ratio >= bound);
    ``step_added_ms`` bounds the ms added per decode step and applies only to workloads with
    ``step_target``.
    """

    config: str
    metric: MetricName
    bound: float
    at_most: bool

    def applies_to(self, workload: Workload) -> bool:
        return self.metric != "step_added_ms" or workload.step_target

    def describe(self) -> str:
        what = {"tok_s": "tok/s", "ttft": "TTFT", "step_added_ms": "+ms/step"}[self.metric]
        unit = " ms" if self.metric == "step_added_ms" else "x"
        return f"{self.config} {what} {'<=' if self.at_most else '>='} {self.bound:g}{unit}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One configuration's figures on one workload, and how they compare with its baseline.

    None where the figure or its baseline was not measured. ``baseline`` is the label the ratios
    compare with (a configuration name: all its servers pooled; ``NAME#1``: the first server).
    """

    label: str
    baseline: str | None
    tok_s: Spread | None
    tok_s_ratio: Spread | None
    ttft_ms: Spread | None
    ttft_ratio: Spread | None
    step_ms: Spread | None
    step_added_ms: Difference | None
    tok_s_vs_oracle: Spread | None
    server_note: str

    def figure(self, metric: MetricName) -> Spread | Difference | None:
        return {"tok_s": self.tok_s_ratio, "ttft": self.ttft_ratio,
                "step_added_ms": self.step_added_ms}[metric]

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _pooled(results: Sequence[ConfigResult], *, workload: Workload,
            read: Callable[[RoundTiming], float]) -> Spread | None:
    values = [read(timing) for result in results
              if (measured := result.workloads.get(workload.name)) is not None
              for timing in measured.rounds]
    return spread(values) if values else None


def _figures(results: Sequence[ConfigResult], *,
             workload: Workload) -> dict[str, Spread | None]:
    """The pooled tok/s (``tok_s``), mean TTFT in ms (``ttft``) and ms per decode step
    (``step``) of ``results`` on ``workload``."""
    readers: dict[str, Callable[[RoundTiming], float]] = {
        "tok_s": lambda timing: timing.tok_s(workload.throughput),
        "ttft": lambda timing: 1e3 * timing.mean_ttft_s,
        "step": lambda timing: timing.step_ms,
    }
    return {name: _pooled(results, workload=workload, read=read)
            for name, read in readers.items()}


def _ratio(numerator: Spread | None, denominator: Spread | None) -> Spread | None:
    if numerator is None or denominator is None or not denominator.median:
        return None
    return ratio(numerator=numerator, denominator=denominator)


def workload_rows(*, workload: Workload, results: Sequence[ConfigResult],
                  baselines: Mapping[str, str | None],
                  vs_oracle: Collection[str]) -> list[Row]:
    """One row per result, in order, on ``workload``. A first server's row (``run`` 1) pools
    the rounds of every server of its configuration; a later server's row is its own.

    Args:
        baselines: per configuration, the configuration it is compared with (None or absent:
            none). A second server (``run`` > 1) is compared with the first of its own
            configuration instead.
        vs_oracle: configurations that also get a throughput ratio to ``oracle``.
    """
    rows = []
    for result in results:
        if result.run > 1:
            baseline_label: str | None = f"{result.config}#1"
            reference = [r for r in results if r.config == result.config and r.run == 1]
        else:
            baseline_label = baselines.get(result.config)
            reference = [r for r in results if r.config == baseline_label]
        oracle = [r for r in results if r.config == "oracle"]
        # a configuration's row pools all its servers; a later server's row is its own
        own_results = ([r for r in results if r.config == result.config]
                       if result.run == 1 else [result])
        own = _figures(own_results, workload=workload)
        base = _figures(reference, workload=workload)
        rows.append(Row(
            label=result.label,
            baseline=baseline_label,
            tok_s=own["tok_s"],
            tok_s_ratio=_ratio(own["tok_s"], base["tok_s"]),
            ttft_ms=own["ttft"],
            ttft_ratio=_ratio(own["ttft"], base["ttft"]),
            step_ms=own["step"],
            step_added_ms=(None if own["step"] is None or base["step"] is None
                           else difference(minuend=own["step"], subtrahend=base["step"])),
            tok_s_vs_oracle=(_ratio(own["tok_s"], _figures(oracle, workload=workload)["tok_s"])
                             if result.config in vs_oracle and result.run == 1 else None),
            server_note=result.server_note,
        ))
    return rows


# The timer names (``host_timers/sitecustomize.py``) of the benchmark models' decoder layers:
# SGLang's own model code, on every eager forward's path (a prefill's), running no canary code.
# Its mean per call in two servers compares how fast the two processes ran the first token's
# host work; decode steps replay graphs and do not call it.
MODEL_CONTROLS = ("Qwen3DecoderLayer.forward", "LlamaDecoderLayer.forward")


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedFunction:
    """One entry of a host-timer line: ``name 12.3us x1.00`` (mean µs per call, calls per
    forward)."""

    name: str
    mean_us: float
    calls_per_forward: float

    @property
    def per_forward_us(self) -> float:
        return self.mean_us * self.calls_per_forward


def timer_entries(line: str, *, strict: bool = False) -> dict[str, TimedFunction]:
    """The entries of a host-timer line (``KV canary host timers over N forwards: name 12.3us
    x1.00, ...``) by name; an empty dict for an empty line.

    Raises:
        ValueError: ``strict`` and an entry that is not ``name <float>us x<float>`` (without
            ``strict`` such an entry is left out).
    """
    entries: dict[str, TimedFunction] = {}
    for entry in filter(None, line.partition(": ")[2].split(", ")):
        parts = entry.strip().split(" ")
        try:
            if len(parts) != 3 or not parts[1].endswith("us") or not parts[2].startswith("x"):
                raise ValueError
            entries[parts[0]] = TimedFunction(name=parts[0], mean_us=float(parts[1][:-2]),
                                              calls_per_forward=float(parts[2][1:]))
        except ValueError:
            if strict:
                raise ValueError(f"not a host-timer entry: {entry!r}") from None
    return entries


def timer_mean_us(line: str, name: str) -> float | None:
    """The mean µs per call of ``name`` in a host-timer line (``...: name 12.3us x1.00, ...``),
    or None where the line does not list it."""
    entry = timer_entries(line).get(name)
    return None if entry is None else entry.mean_us


def model_control_us(result: ConfigResult, *, workload: Workload) -> tuple[str, float] | None:
    """``(timer name, mean µs per call)`` of the model's decoder layer in the timer line this
    server logged during ``workload``, or None (no line, or no eager forward in its window)."""
    measured = result.workloads.get(workload.name)
    if measured is None or not measured.host_timers:
        return None
    for name in MODEL_CONTROLS:
        value = timer_mean_us(measured.host_timers, name)
        if value is not None:
            return name, value
    return None


def control_line(*, workload: Workload, results: Sequence[ConfigResult]) -> str | None:
    """Each server's decoder-layer control on ``workload`` (None when no server has one)."""
    found = [(result.label, model_control_us(result, workload=workload)) for result in results]
    found = [(label, control) for label, control in found if control is not None]
    if not found:
        return None
    names = sorted({name for _, (name, _) in found})
    return (f"  model control ({', '.join(names)}: mean µs per call in each server's timer "
            "line; SGLang's own code, no canary code): "
            + ", ".join(f"{label} {value:.1f}" for label, (_, value) in found))


def request_ttfts_ms(results: Sequence[ConfigResult], *, workload: Workload) -> list[float]:
    """Every request's TTFT in ms over the measured rounds of ``results`` on ``workload``."""
    return [1e3 * ttft for result in results
            if (measured := result.workloads.get(workload.name)) is not None
            for timing in measured.rounds for ttft in timing.ttft_s]


def ttft_percentiles_ms(ttfts_ms: Sequence[float]) -> tuple[float, float, float]:
    """``(p10, p50, p90)`` of per-request TTFTs (at least one; with fewer than two, each is the
    one value). Percentiles by the "inclusive" method: they never leave the measured range."""
    if len(ttfts_ms) < 2:
        return (ttfts_ms[0],) * 3
    deciles = statistics.quantiles(ttfts_ms, n=10, method="inclusive")
    return deciles[0], statistics.median(ttfts_ms), deciles[8]


def ttft_distribution_line(*, workload: Workload, results: Sequence[ConfigResult],
                           baselines: Mapping[str, str | None]) -> str | None:
    """Each server's per-request TTFT percentiles on ``workload`` and, per configuration with a
    baseline in the run, the ratio of the pooled medians (every request of every server of the
    configuration against every request of its baseline's); None when no server measured it.

    The mean TTFT of a round (the table's column) takes in every slow request: a stretch of
    requests where a server process ran slow, or one garbage-collection pause, moves it. The
    median of the requests does not, and a p90 far above the p50 shows such a stretch."""
    servers = [(result.label, request_ttfts_ms([result], workload=workload))
               for result in results]
    servers = [(label, ttfts) for label, ttfts in servers if ttfts]
    if not servers:
        return None
    parts = [f"{label} " + "/".join(f"{value:.1f}" for value in ttft_percentiles_ms(ttfts))
             for label, ttfts in servers]
    ratios = []
    for config in dict.fromkeys(result.config for result in results):
        baseline = baselines.get(config)
        own = request_ttfts_ms([r for r in results if r.config == config], workload=workload)
        base = request_ttfts_ms([r for r in results if r.config == baseline], workload=workload)
        if own and base:
            ratios.append(f"{config} / {baseline} "
                          f"x{statistics.median(own) / statistics.median(base):.3f}")
    line = ("  TTFT per request (ms, p10/p50/p90 over every request of a server's measured "
            "rounds): " + ", ".join(parts))
    if ratios:
        line += "; pooled medians: " + ", ".join(ratios)
    return line


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair:
    """One server against the server of its baseline configuration started just before it
    (labels ``NAME#run``); None where either did not measure the figure. ``control_ratio``:
    the server's decoder-layer control over the baseline server's (:data:`MODEL_CONTROLS`),
    where both timer lines have it: above 1, this server's process ran SGLang's own model code
    slower. ``ttft_p50_ratio``: the median of the server's per-request TTFTs over the baseline
    server's (see :func:`ttft_distribution_line`)."""

    label: str
    baseline: str
    tok_s_ratio: Spread | None
    ttft_ratio: Spread | None
    step_added_ms: Difference | None
    control_ratio: float | None = None
    ttft_p50_ratio: float | None = None

    def describe(self) -> str:
        p50 = "" if self.ttft_p50_ratio is None else f" (p50 x{self.ttft_p50_ratio:.3f})"
        control = ("" if self.control_ratio is None
                   else f", model control x{self.control_ratio:.3f}")
        return (f"{self.label} / {self.baseline} {_versus(self.tok_s_ratio)}, TTFT "
                f"{_versus(self.ttft_ratio)}{p50}, {_added(self.step_added_ms)} ms/step{control}")


def paired_comparisons(*, workload: Workload, results: Sequence[ConfigResult],
                       baselines: Mapping[str, str | None]) -> list[Pair]:
    """Each server (``results`` in the order they were started) against the last server of its
    configuration's baseline started before it, on ``workload``: servers started next to each
    other, so slow drift over a run does not enter as it does in the pooled rows. Empty when no
    baseline configuration of the run has two servers (the pooled rows are then these pairs);
    a server started before any of its baseline's is left out."""
    servers_of: dict[str, int] = {}
    for result in results:
        servers_of[result.config] = servers_of.get(result.config, 0) + 1
    if not any(servers_of.get(baselines.get(config) or "", 0) > 1 for config in servers_of):
        return []
    pairs = []
    for index, result in enumerate(results):
        baseline = baselines.get(result.config)
        earlier = [other for other in results[:index] if other.config == baseline]
        if baseline is None or not earlier:
            continue
        reference = earlier[-1]
        own = _figures([result], workload=workload)
        base = _figures([reference], workload=workload)
        if own["tok_s"] is None or base["tok_s"] is None:
            continue
        own_control = model_control_us(result, workload=workload)
        base_control = model_control_us(reference, workload=workload)
        own_ttfts = request_ttfts_ms([result], workload=workload)
        base_ttfts = request_ttfts_ms([reference], workload=workload)
        pairs.append(Pair(
            label=f"{result.config}#{result.run}",
            baseline=f"{reference.config}#{reference.run}",
            tok_s_ratio=_ratio(own["tok_s"], base["tok_s"]),
            ttft_ratio=_ratio(own["ttft"], base["ttft"]),
            step_added_ms=(None if own["step"] is None or base["step"] is None
                           else difference(minuend=own["step"], subtrahend=base["step"])),
            control_ratio=(own_control[1] / base_control[1]
                           if own_control and base_control and base_control[1] > 0 else None),
            ttft_p50_ratio=(statistics.median(own_ttfts) / statistics.median(base_ttfts)
                            if own_ttfts and base_ttfts else None),
        ))
    return pairs



@dataclass(frozen=True, slots=True, kw_only=True)
class RoundPairs:
    """A configuration against its baseline, round by round, from servers measured together
    (``--together``): round k of ``NAME#j`` over round k of the baseline's server ``#j``, which
    ran in the same sweep, seconds apart. ``ratios``: those tok/s ratios, over every ``j``.
    (``NAME#k`` against ``NAME#1``: the later servers of one configuration against its first.)"""

    config: str
    baseline: str
    ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def quartiles(self) -> tuple[float, float] | None:
        """The first and third quartiles (None for a single round)."""
        if len(self.ratios) < 2:
            return None
        low, _, high = statistics.quantiles(sorted(self.ratios), n=4, method="inclusive")
        return low, high

    def describe(self) -> str:
        quartiles = self.quartiles
        spread = "" if quartiles is None else f", quartiles {quartiles[0]:.3f}..{quartiles[1]:.3f}"
        return (f"{self.config} / {self.baseline} median {self.median:.3f}{spread} over "
                f"{len(self.ratios)} rounds")


def round_pairs(*, workload: Workload, results: Sequence[ConfigResult],
                baselines: Mapping[str, str | None]) -> list[RoundPairs]:
    """The tok/s ratio of each measured round to the same round of another server measured
    together with it (see :class:`RoundPairs`): per configuration with its baseline in
    ``results``, its server of each run against the baseline's server of that run; and per
    configuration with several servers, ``NAME#k`` against ``NAME#1`` (the same configuration:
    what the machine alone does to these ratios). A round either server lacks is left out."""
    by_label = {(result.config, result.run): result for result in results}
    ratios: dict[tuple[str, str], list[float]] = {}

    def add(key: tuple[str, str], result: ConfigResult, reference: ConfigResult | None) -> None:
        own = result.workloads.get(workload.name)
        base = None if reference is None else reference.workloads.get(workload.name)
        if own is None or base is None:
            return
        for mine, theirs in zip(own.rounds, base.rounds):
            below = theirs.tok_s(workload.throughput)
            if below > 0:
                ratios.setdefault(key, []).append(mine.tok_s(workload.throughput) / below)

    for result in results:
        baseline = baselines.get(result.config)
        if baseline:
            add((result.config, baseline), result, by_label.get((baseline, result.run)))
    for result in results:
        if result.run > 1:
            add((f"{result.config}#k", f"{result.config}#1"), result,
                by_label.get((result.config, 1)))
    return [RoundPairs(config=config, baseline=baseline, ratios=tuple(values))
            for (config, baseline), values in ratios.items()]

@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A target checked on one workload: ``value`` is None when it was not measured."""

    workload: str
    target: str
    value: float | None
    half_width: float | None
    met: bool | None
    within_noise: bool

    def describe(self) -> str:
        if self.value is None:
            return f"{self.target}: not measured"
        state = "met" if self.met else "MISSED"
        noise = " (within noise)" if self.within_noise else ""
        return f"{self.target}: {self.value:.3f} ±{self.half_width:.3f} {state}{noise}"


def check_targets(*, workload: Workload, rows: Sequence[Row],
                  targets: Sequence[Target]) -> list[Verdict]:
    """Each target that applies to ``workload``, checked on the first row of its configuration."""
    verdicts = []
    for target in targets:
        if not target.applies_to(workload):
            continue
        row = next((row for row in rows if row.label == target.config), None)
        figure = None if row is None else row.figure(target.metric)
        if figure is None:
            verdicts.append(Verdict(workload=workload.name, target=target.describe(), value=None,
                                    half_width=None, met=None, within_noise=False))
            continue
        value = figure.value if isinstance(figure, Difference) else figure.median
        met = value <= target.bound if target.at_most else value >= target.bound
        verdicts.append(Verdict(workload=workload.name, target=target.describe(), value=value,
                                half_width=figure.half_width, met=met,
                                within_noise=abs(value - target.bound) <= figure.half_width))
    return verdicts


def check_round_targets(*, by_round: Sequence[RoundPairs], targets: Sequence[Target],
                        baselines: Mapping[str, str | None]) -> list[str]:
    """Each throughput target checked on the round-by-round ratios of its configuration
    against its baseline (servers measured together): the median against the bound, and
    whether the quartiles straddle it ("within quartiles"). Other metrics are not paired by
    round."""
    lines = []
    for target in targets:
        if target.metric != "tok_s":
            continue
        pairs = next((pairs for pairs in by_round if pairs.config == target.config
                      and pairs.baseline == baselines.get(target.config)), None)
        if pairs is None:
            continue
        median, quartiles = pairs.median, pairs.quartiles
        met = median <= target.bound if target.at_most else median >= target.bound
        spread = ("" if quartiles is None
                  else f" (quartiles {quartiles[0]:.3f}..{quartiles[1]:.3f})")
        straddles = quartiles is not None and quartiles[0] <= target.bound <= quartiles[1]
        lines.append(f"{target.describe()}: {median:.3f}{spread} {'met' if met else 'MISSED'}"
                     + (" (within quartiles)" if straddles else ""))
    return lines


# ----------------------------------------------------------------------------- printing

def _value(figure: Spread | None, template: str) -> str:
    if figure is None:
        return "-"
    return f"{template.format(figure.median)} ±{100 * figure.relative_spread / 2:.1f}%"


def _versus(figure: Spread | None) -> str:
    return "-" if figure is None else f"{figure.median:.3f} ±{figure.half_width:.3f}"


def _added(figure: Difference | None) -> str:
    return "-" if figure is None else f"{figure.value:+.3f} ±{figure.half_width:.3f}"


_HEADERS = ("config", "vs", "tok/s", "x vs", "TTFT ms", "x vs", "ms/step", "+ms vs",
            "tok/s x oracle", "server log")


def format_workload_table(*, workload: Workload, rows: Sequence[Row],
                          verdicts: Sequence[Verdict], notes: Sequence[str],
                          pairs: Sequence[Pair] = (), controls: str | None = None,
                          ttft_distribution: str | None = None,
                          by_round: Sequence[RoundPairs] = (),
                          round_verdicts: Sequence[str] = ()) -> str:
    """A workload's block: its description, one line per row (columns aligned), the targets
    with their verdicts, ``pairs`` (tok/s ratio, TTFT ratio and ms per step added of each server
    against the baseline server started just before it, and their model controls' ratio),
    ``by_round`` (:func:`round_pairs`, servers measured together) with ``round_verdicts``
    (:func:`check_round_targets`),
    ``ttft_distribution`` (:func:`ttft_distribution_line`), ``controls`` (:func:`control_line`)
    and ``notes`` (e.g. why a configuration has no figures)."""
    cells = [[row.label, row.baseline or "-", _value(row.tok_s, "{:.0f}"),
              _versus(row.tok_s_ratio), _value(row.ttft_ms, "{:.1f}"), _versus(row.ttft_ratio),
              _value(row.step_ms, "{:.3f}"), _added(row.step_added_ms),
              _versus(row.tok_s_vs_oracle), row.server_note] for row in rows]
    widths = [max([len(header)] + [len(line[index]) for line in cells])
              for index, header in enumerate(_HEADERS)]

    def line(values: Sequence[str]) -> str:
        left = [values[0].ljust(widths[0]), values[1].ljust(widths[1])]
        numbers = [value.rjust(width) for value, width in zip(values[2:-1], widths[2:-1])]
        return "  ".join(["  " + left[0], *left[1:], *numbers, values[-1]]).rstrip()

    text = [f"{workload.name}: {workload.describe()}", line(_HEADERS)]
    text += [line(values) for values in cells]
    if verdicts:
        text.append("  targets: " + "; ".join(verdict.describe() for verdict in verdicts))
    if pairs:
        text.append("  pairs (each server vs the baseline server started just before it; tok/s): "
                    + "; ".join(pair.describe() for pair in pairs))
    if by_round:
        text.append("  by round (servers measured together: each round over the same round of "
                    "the baseline's server of the same run, seconds apart; tok/s): "
                    + "; ".join(pairs_.describe() for pairs_ in by_round))
    if round_verdicts:
        text.append("  targets by round: " + "; ".join(round_verdicts))
    if ttft_distribution:
        text.append(ttft_distribution)
    if controls:
        text.append(controls)
    text += [f"  note: {note}" for note in notes]
    return "\n".join(text)


def workload_notes(*, workload: Workload, results: Sequence[ConfigResult]) -> list[str]:
    """Why a server has no (or fewer) rounds of ``workload``."""
    notes = []
    for result in results:
        measured = result.workloads.get(workload.name)
        if measured is not None and measured.status != MEASURED:
            notes.append(f"{result.label}: {measured.status}")
        elif measured is None and result.status != MEASURED:
            notes.append(f"{result.label}: {result.status}")
        elif measured is None:
            notes.append(f"{result.label}: not reached")
    return notes
