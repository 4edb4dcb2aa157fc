"""What the server's log says about the burn-in: the canary's lines and SGLang's retractions.

The burn-in's *window* is what the log gained after ``start_offset`` (a started server's log:
all of it). :func:`read_findings` classifies the window with
:func:`sglang.srt.kv_canary.tools.canary_log.parse_canary_log` (the start-up line is looked for
in the whole log, as a running server logged it long before); :class:`LogFollower` reads the
window as it grows, for the progress line.

A violation is a ``kv_canary violation:`` line with a ``reasons=`` field; the same row logged
twice (raise mode logs the rows, then raises with them) counts once. Other canary lines of the
window (``violation repeats``, ``ring overflow``, errors) are kept as notices.
"""

from __future__ import annotations

import pathlib
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sglang.srt.kv_canary.monitor.stats import IDLE_LINE_RE, STATS_LINE_RE
from sglang.srt.kv_canary.tools.canary_log import CanaryLogSummary, parse_canary_log

# SGLang 0.5.12's scheduler, when decoding outgrows the KV pool.
RETRACTION_RE = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")
HEALTH_FAILURE_MARK = "health check failed"


def _read(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def violation_messages(summary: CanaryLogSummary) -> list[str]:
    """The distinct violation rows of a parsed log (lines with ``reasons=``), in order."""
    seen: dict[str, None] = {}
    for line in summary.violations:
        if "reasons" in line.fields:
            seen.setdefault(line.message, None)
    return list(seen)


class LogFollower:
    """Reads a log's window as it grows, whole lines at a time (one reader)."""

    def __init__(self, *, path: pathlib.Path, start_offset: int) -> None:
        self._path = path
        self._offset = start_offset
        self._partial = b""
        self._seen: set[str] = set()

    def poll(self) -> str:
        """The whole lines written since the last poll."""
        try:
            with self._path.open("rb") as log:
                log.seek(self._offset)
                data = log.read()
        except FileNotFoundError:
            return ""
        self._offset += len(data)
        data = self._partial + data
        end = data.rfind(b"\n") + 1
        self._partial = data[end:]
        return _decode(data[:end])

    def wait_until_polled(self, *, timeout_s: float, quiet_s: float = 0.5,
                          clock: Callable[[], float] = time.monotonic,
                          sleep: Callable[[float], None] = time.sleep) -> bool:
        """Wait, at most ``timeout_s``, for the canary's idle line (logged once the counters of
        the server's last forward were read: every row before it) and then ``quiet_s`` without
        a newer one; True when it came. The lines read are counted as :meth:`poll` reads them
        (call it after the workload's last answer)."""
        deadline = clock() + timeout_s
        seen_idle = False
        while True:
            text = self.poll()
            self._seen.update(violation_messages(parse_canary_log(text)))
            if IDLE_LINE_RE.search(text):
                seen_idle = True
                quiet_until = clock() + quiet_s
            elif seen_idle and clock() >= quiet_until:
                return True
            if clock() >= deadline:
                return seen_idle
            sleep(0.05)

    def violations_so_far(self) -> int:
        """Distinct violation rows in the window up to now (polls the log)."""
        self._seen.update(violation_messages(parse_canary_log(self.poll())))
        return len(self._seen)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogFindings:
    """What the log says (see the module docstring).

    Attributes:
        path: the log file.
        window_bytes: the window's size.
        restarted: the log was shorter than ``start_offset`` (rotated or rewritten): the
            window is the whole file.
        startup: the ``KV canary enabled`` messages of the whole log (one per scheduler).
        latest_stats: the newest stats message of the window (None: none in the window).
        protected: slot verifications that stats line reports (cumulative since start-up).
        stats_violations: violation rows that stats line reports (cumulative).
        health_ok: passed canary health checks in the window.
        health_failures: failed canary health checks in the window.
        violations: the distinct violation rows of the window, in order.
        by_reason: violation rows per reason label (a row with two reasons counts for both;
            draft-pool rows as ``<label> (draft)``).
        notices: other canary messages of the window.
        retractions: SGLang's "KV cache pool is full. Retract requests." lines in the window.
        retracted_requests: the requests those lines retracted.
    """

    path: pathlib.Path
    window_bytes: int
    restarted: bool
    startup: tuple[str, ...]
    latest_stats: str | None
    protected: int | None
    stats_violations: int | None
    health_ok: int
    health_failures: tuple[str, ...]
    violations: tuple[str, ...]
    by_reason: Mapping[str, int] = field(default_factory=dict)
    notices: tuple[str, ...] = ()
    retractions: int = 0
    retracted_requests: int = 0


def _by_reason(summary: CanaryLogSummary) -> dict[str, int]:
    counts: Counter[str] = Counter()
    seen: set[str] = set()
    for line in summary.violations:
        reasons = line.fields.get("reasons")
        if reasons is None or line.message in seen:
            continue
        seen.add(line.message)
        suffix = " (draft)" if line.fields.get("pool") == "draft" else ""
        counts.update(f"{label}{suffix}" for label in reasons.split("+"))
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def read_findings(*, path: pathlib.Path, start_offset: int) -> LogFindings:
    """Classify the log at ``path`` from ``start_offset`` on (see the module docstring)."""
    data = _read(path)
    restarted = len(data) < start_offset
    offset = 0 if restarted else start_offset
    head, window = _decode(data[:offset]), _decode(data[offset:])
    found = parse_canary_log(window)
    startup = parse_canary_log(head).startup + found.startup
    latest = found.latest_stats
    match = STATS_LINE_RE.search(latest.message) if latest is not None else None
    health_failures = tuple(n.strip() for n in found.notices if HEALTH_FAILURE_MARK in n)
    notices = tuple(n.strip() for n in found.notices if HEALTH_FAILURE_MARK not in n) + tuple(
        line.message for line in found.violations if "reasons" not in line.fields)
    retractions = [int(m.group(1)) for m in map(RETRACTION_RE.search, window.splitlines()) if m]
    return LogFindings(
        path=path, window_bytes=len(data) - offset, restarted=restarted,
        startup=tuple(line.message for line in startup),
        latest_stats=latest.message if latest is not None else None,
        protected=int(match["protected"]) if match else None,
        stats_violations=int(match["violations"]) if match else None,
        health_ok=len(found.health_ok), health_failures=health_failures,
        violations=tuple(violation_messages(found)),
        by_reason=MappingProxyType(_by_reason(found)), notices=notices,
        retractions=len(retractions), retracted_requests=sum(retractions),
    )
