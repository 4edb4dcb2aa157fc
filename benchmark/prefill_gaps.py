"""Per-request gaps between batch-1 prefills in SGLang server logs: which server processes ran
slowly, and whether for the whole run or in stretches.

What it reads: the server logs ``bench_server_overhead.py --log-dir DIR`` wrote (a folder, or a
``.tar.gz`` of one as kept under ``benchmark/results/``). In each ``*.log`` it takes SGLang's
``Prefill batch`` lines of one new sequence with ``--new-tokens`` new tokens and no cached token
(the 128-token prompts of ``ttft1`` and ``bs1``). SGLang 0.5.12 prints on each such line
``input throughput (token/s)``, the line's new tokens divided by the time since the previous
prefill line (``report_prefill_stats`` in ``observability/scheduler_metrics_mixin.py``), so
``new tokens / throughput`` is that time. In ``ttft1``, whose 32 requests per round are sent one
after another, it is one request's whole cycle: its prefill, its decode step, the client's next
request. The benchmark's TTFT is a part of it.

What it prints, per log: how many gaps it kept (the first ``--first`` of them, leaving out gaps
longer than ``--max-gap-ms``: the first request after a pause, a garbage collection), their
p10 / p50 / p90 in ms, and how many are slow: longer than ``--slow-factor`` times the smallest
p10 among the logs of the same source and model (the log name's part before the first ``-``).
A process that is slow throughout shows a high p50; one that changes speed during the run
shows a bimodal spread and a slow count between the ends. Then, per model and configuration
(the ``MODEL-CONFIG-runN.log`` name), over the logs with at least half of ``--first`` gaps that
have another log of their model in their source: how many were slow at their median, and how
many had a quarter or more of their gaps slow.

    python benchmark/prefill_gaps.py benchmark/results/2026-11-29-h200-close2-03bb969-logs.tar.gz
    python benchmark/prefill_gaps.py benchmark/results/*-logs.tar.gz --model 8b

Runs on any machine (no server, no GPU).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tarfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from server_overhead_table import ttft_percentiles_ms

_RUN_SUFFIX = re.compile(r"-run\d+\.log$")
_PREFILL_LINE = re.compile(
    r"Prefill batch, #new-seq: 1, #new-token: (?P<new>\d+), #cached-token: 0,"
    r".*input throughput \(token/s\): (?P<throughput>[0-9.]+)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogGaps:
    """The kept gaps (ms, in log order) of one server log."""

    source: str
    log: str
    gaps_ms: tuple[float, ...]
    dropped: int  # gaps longer than --max-gap-ms among the first --first

    @property
    def model(self) -> str:
        return self.log.split("-", 1)[0]

    @property
    def config(self) -> str:
        """The configuration in a ``MODEL-CONFIG-runN.log`` name."""
        return config_of(self.log)

    def percentiles(self) -> tuple[float, float, float]:
        """``(p10, p50, p90)`` of the gaps, by the rule the server tables use for TTFTs."""
        return ttft_percentiles_ms(self.gaps_ms)


def config_of(log: str) -> str:
    """The configuration in a server log named ``MODEL-CONFIG-runN.log``."""
    return _RUN_SUFFIX.sub("", log.split("-", 1)[-1])


def prefill_gaps_ms(lines: Iterator[str], *, new_tokens: int) -> Iterator[float]:
    """Milliseconds since the previous prefill line, for each matching prefill line."""
    for line in lines:
        match = _PREFILL_LINE.search(line)
        if match is None or int(match["new"]) != new_tokens:
            continue
        throughput = float(match["throughput"])
        if throughput > 0:
            yield new_tokens * 1000.0 / throughput


def logs_of(source: pathlib.Path) -> Iterator[tuple[str, list[str]]]:
    """(log file name, its lines) of every ``*.log`` under a folder or in a ``.tar.gz``."""
    if source.is_dir():
        for path in sorted(source.rglob("*.log")):
            yield path.name, path.read_text(errors="replace").splitlines()
        return
    with tarfile.open(source, "r:gz") as archive:
        members = sorted(
            (member for member in archive.getmembers()
             if member.isfile() and member.name.endswith(".log")),
            key=lambda member: member.name,
        )
        for member in members:
            data = archive.extractfile(member)
            if data is not None:
                yield pathlib.PurePath(member.name).name, (
                    data.read().decode(errors="replace").splitlines()
                )


def read_source(
    source: pathlib.Path, *, new_tokens: int, first: int, max_gap_ms: float, model: str | None
) -> list[LogGaps]:
    """The gaps of every log of ``source`` (of ``model`` only, when given) that has any."""
    found = []
    for name, lines in logs_of(source):
        if model is not None and not name.startswith(f"{model}-"):
            continue
        gaps = list(prefill_gaps_ms(iter(lines), new_tokens=new_tokens))[:first]
        kept = tuple(gap for gap in gaps if gap <= max_gap_ms)
        if kept:
            found.append(LogGaps(source=source.name, log=name, gaps_ms=kept,
                                 dropped=len(gaps) - len(kept)))
    return found


def _slow_bounds(logs: Sequence[LogGaps], *, slow_factor: float) -> list[float]:
    """Per log: ``slow_factor`` times the smallest p10 among the logs of its source and model."""
    fastest: dict[tuple[str, str], float] = {}
    for log in logs:
        key = (log.source, log.model)
        fastest[key] = min(fastest.get(key, float("inf")), log.percentiles()[0])
    return [slow_factor * fastest[(log.source, log.model)] for log in logs]


def report(logs: Sequence[LogGaps], *, slow_factor: float) -> list[str]:
    """One line per log (see the module docstring)."""
    lines = []
    for log, bound in zip(logs, _slow_bounds(logs, slow_factor=slow_factor)):
        slow = sum(1 for gap in log.gaps_ms if gap > bound)
        p10, p50, p90 = log.percentiles()
        lines.append(
            f"{log.source}  {log.log}: {len(log.gaps_ms)} gaps ({log.dropped} over the limit "
            f"left out), p10 {p10:.1f} / p50 {p50:.1f} / p90 {p90:.1f} ms, {slow} over "
            f"{bound:.1f} ms"
        )
    return lines


def summary(logs: Sequence[LogGaps], *, slow_factor: float, min_gaps: int) -> list[str]:
    """Per model and configuration, over its logs with at least ``min_gaps`` gaps: how many
    were slow at their median (p50 over the bound) and how many had a quarter or more of their
    gaps slow. A source with one log of a model has nothing to compare it with: left out."""
    logs_per_source = Counter((log.source, log.model) for log in logs)
    counts: dict[tuple[str, str], list[int]] = {}
    for log, bound in zip(logs, _slow_bounds(logs, slow_factor=slow_factor)):
        if len(log.gaps_ms) < min_gaps or logs_per_source[(log.source, log.model)] == 1:
            continue
        slow = sum(1 for gap in log.gaps_ms if gap > bound)
        entry = counts.setdefault((log.model, log.config), [0, 0, 0])
        entry[0] += 1
        entry[1] += log.percentiles()[1] > bound
        entry[2] += 4 * slow >= len(log.gaps_ms)
    return [
        f"{model} {config}: {total} logs, slow at the median in {median_slow}, "
        f"a quarter or more of the gaps slow in {quarter_slow}"
        for (model, config), (total, median_slow, quarter_slow) in sorted(counts.items())
    ]


def _positive(*, kind: type, option: str) -> Callable[[str], float]:
    """An argparse type: ``kind(text)`` when it is > 0, else an error naming the option, the
    value and what is allowed."""
    allowed = "an integer > 0" if kind is int else "a number > 0"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"{option}={text} is invalid; allowed: {allowed}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=pathlib.Path,
                        help="log folders or .tar.gz files of them")
    parser.add_argument("--new-tokens", type=_positive(kind=int, option="--new-tokens"),
                        default=128, help="the prompts' new tokens (default 128: ttft1 and bs1)")
    parser.add_argument("--first", type=_positive(kind=int, option="--first"), default=100,
                        help="gaps read per log (default 100: ttft1's rounds come first)")
    parser.add_argument("--max-gap-ms", type=_positive(kind=float, option="--max-gap-ms"),
                        default=300.0, help="longer gaps are left out (default 300 ms)")
    parser.add_argument("--slow-factor", type=_positive(kind=float, option="--slow-factor"),
                        default=1.3,
                        help="a gap over this times the source's smallest p10 is slow "
                             "(default 1.3)")
    parser.add_argument("--model", default=None,
                        help="only logs named MODEL-... (e.g. 8b)")
    args = parser.parse_args(argv)
    logs: list[LogGaps] = []
    for source in args.sources:
        if not source.exists():
            print(f"prefill_gaps: {source} does not exist", file=sys.stderr)
            return 2
        logs += read_source(source, new_tokens=args.new_tokens, first=args.first,
                            max_gap_ms=args.max_gap_ms, model=args.model)
    if not logs:
        print(f"prefill_gaps: no log with prefill lines of {args.new_tokens} new tokens",
              file=sys.stderr)
        return 1
    print("\n".join(report(logs, slow_factor=args.slow_factor)))
    totals = summary(logs, slow_factor=args.slow_factor, min_gaps=(args.first + 1) // 2)
    if totals:
        print(f"by configuration (logs with at least {(args.first + 1) // 2} gaps, beside "
              "another log of their model in their source):")
        print("\n".join(f"  {line}" for line in totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
