"""The summary of a report file: violation rows counted by reason, by check and by request
(``rid``), each with its repeats and its first and last step, and the ring overflows."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sglang.srt.kv_canary.report.reading import ReportContents, ReportObject
from sglang.srt.kv_canary.report.schema import POOL_KEY

UNKNOWN_RID = "(unknown)"  # the rid column of rows whose request the canary did not know


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """The violation rows of one reason, check or request."""

    key: str
    rows: int
    repeats: int  # rows log mode did not print (the same corruption, one step later)
    first_step: int
    last_step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportSummary:
    """What :func:`format_summary` prints."""

    path: str
    canaries: tuple[str, ...]  # "pid 4242 (mode log)", "pid 4242 pool draft (mode log)", ...
    rows: int
    repeats: int
    first_step: int | None  # None: no violation row
    last_step: int | None
    overflow_reports: int
    dropped: int
    by_reason: tuple[Tally, ...]  # a row with several reasons counts under each
    by_check: tuple[Tally, ...]
    by_rid: tuple[Tally, ...]


def summarize(contents: ReportContents) -> ReportSummary:
    """Count the violation rows and overflows of ``contents``; tallies are sorted by rows
    (most first), then by key."""
    violations = contents.violations
    steps = [row["step"] for row in violations]
    return ReportSummary(
        path=contents.path,
        canaries=tuple(_canary(header) for header in contents.headers),
        rows=len(violations),
        repeats=sum(row["repeat"] for row in violations),
        first_step=min(steps, default=None),
        last_step=max(steps, default=None),
        overflow_reports=len(contents.overflows),
        dropped=sum(overflow["dropped"] for overflow in contents.overflows),
        by_reason=_tally(violations, keys=lambda row: row["reasons"]),
        by_check=_tally(violations, keys=lambda row: [row["check"]]),
        by_rid=_tally(violations, keys=lambda row: [row["rid"] or UNKNOWN_RID]),
    )


def _canary(header: ReportObject) -> str:
    pool = f" pool {header[POOL_KEY]}" if POOL_KEY in header else ""
    mode = header["config"].get("mode") if isinstance(header["config"], dict) else None
    return f"pid {header['pid']}{pool} (mode {mode})"


def _tally(
    rows: Iterable[ReportObject], *, keys: Callable[[ReportObject], Iterable[str]]
) -> tuple[Tally, ...]:
    counts: dict[str, list[int]] = {}  # key -> [rows, repeats, first step, last step]
    for row in rows:
        step = row["step"]
        for key in keys(row):
            entry = counts.get(key)
            if entry is None:
                counts[key] = [1, int(row["repeat"]), step, step]
                continue
            entry[0] += 1
            entry[1] += row["repeat"]
            entry[2] = min(entry[2], step)
            entry[3] = max(entry[3], step)
    tallies = [
        Tally(key=key, rows=n, repeats=repeats, first_step=first, last_step=last)
        for key, (n, repeats, first, last) in counts.items()
    ]
    return tuple(sorted(tallies, key=lambda tally: (-tally.rows, tally.key)))


def format_summary(summary: ReportSummary, *, max_requests: int = 20) -> str:
    """The summary as text: a few lines about the file, then one table per grouping (the
    request table keeps the ``max_requests`` requests with the most rows; 0: all)."""
    count = len(summary.canaries)
    lines = [
        f"kv_canary report {summary.path}",
        f"  {count} canar{'y' if count == 1 else 'ies'}: {', '.join(summary.canaries)}",
    ]
    if summary.rows == 0:
        lines.append("  no violation rows")
    else:
        lines.append(
            f"  {summary.rows} violation row(s) ({summary.repeats} repeat(s) of an earlier "
            f"report), steps {summary.first_step}..{summary.last_step}"
        )
    lines.append(
        f"  {summary.overflow_reports} ring overflow report(s), {summary.dropped} row(s) dropped"
    )
    if summary.rows == 0:
        return "\n".join(lines)
    requests = summary.by_rid
    hidden = 0
    if max_requests > 0 and len(requests) > max_requests:
        requests, hidden = requests[:max_requests], len(requests) - max_requests
    lines += ["", *_table("by reason", summary.by_reason)]
    lines.append("(a row with several reasons counts under each)")
    lines += ["", *_table("by check", summary.by_check)]
    lines += ["", *_table("by request (rid)", requests)]
    if hidden:
        lines.append(f"... and {hidden} more request(s) (--top 0 lists all)")
    return "\n".join(lines)


_COLUMNS = ("rows", "repeats", "first step", "last step")


def _table(title: str, tallies: tuple[Tally, ...]) -> list[str]:
    width = max([len(title), *(len(tally.key) for tally in tallies)])
    header = f"{title:<{width}}  " + "  ".join(f"{column:>10}" for column in _COLUMNS)
    body = [
        f"{tally.key:<{width}}  " + "  ".join(
            f"{value:>10}"
            for value in (tally.rows, tally.repeats, tally.first_step, tally.last_step)
        )
        for tally in tallies
    ]
    return [header, *body]
