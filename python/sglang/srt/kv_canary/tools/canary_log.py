"""Read what the canary said from a server log: the one parser every tool and test uses.

Three kinds of lines are recognized wherever they sit in a line (SGLang prefixes its own
``[time TPn]`` and the logger may add more), case-insensitively, ``KV canary`` or ``kv_canary``:

* start-up: ``KV canary enabled: mode=log real_data=none ...`` (one per scheduler process);
* stats: ``KV canary stats: ...`` (``key=value`` pairs or phrases such as ``1234 tokens``);
* health: ``kv_canary health ok: ...`` (a passed health check);
* violations: ``kv_canary violation: key=value ...`` (one line per violation row).

Any other line that names the canary as a word (not inside a path or a module name) is kept as
a notice (warnings, errors, health-check failures), except the informational lines of SGLang's
plugin loader. Unknown keys are kept, not rejected:
the exact formats belong to the modules that log them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

_STARTUP = re.compile(r"kv[ _]canary enabled\s*:", re.IGNORECASE)
_STATS = re.compile(r"kv[ _]canary stats\b[^:\n]*:", re.IGNORECASE)
_VIOLATION = re.compile(r"kv[ _]canary violation\b[^:\n]*:", re.IGNORECASE)
_HEALTH_OK = re.compile(r"kv[ _]canary health ok\s*:", re.IGNORECASE)
_MENTION = re.compile(r"kv[ _]canary", re.IGNORECASE)
# A mention as a word: not inside a path, module name or variable name (those show up in
# SGLang's own lines, e.g. its server_args line, and say nothing about the canary).
_WORD_MENTION = re.compile(r"(?<![\w/.-])kv[ _]canary(?![\w/.-])", re.IGNORECASE)
# SGLang's plugin loader naming our entry point at INFO level (its failures are kept as notices).
_LOADER_BOOKKEEPING = re.compile(
    r"-> sglang\.srt\.kv_canary\.plugin:activate|Loaded plugin kv_canary\b"
    r"|Executed general plugin: kv_canary\b|Applied \d+ hook\(s\) to "
)
_KEY_VALUE = re.compile(r"([A-Za-z_][\w.]*)=(\S+)")
_NUMBER_WORD = re.compile(r"(?<![\w=.])(\d+)\s+([A-Za-z_]+)")
_TRAILING_PUNCTUATION = ",;"


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryLogLine:
    """One recognized line.

    Attributes:
        text: the whole log line.
        message: the line from its marker on (SGLang's prefix dropped).
        fields: ``key=value`` pairs after the marker (trailing ``,``/``;`` stripped).
        counts: the integers: ``key=<int>`` pairs and ``<int> <word>`` phrases (keyed by word).
    """

    text: str
    message: str
    fields: Mapping[str, str]
    counts: Mapping[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryLogSummary:
    startup: tuple[CanaryLogLine, ...]
    stats: tuple[CanaryLogLine, ...]
    health_ok: tuple[CanaryLogLine, ...]
    violations: tuple[CanaryLogLine, ...]
    notices: tuple[str, ...]

    @property
    def latest_stats(self) -> CanaryLogLine | None:
        return self.stats[-1] if self.stats else None


def _parse_line(text: str, marker: re.Match[str]) -> CanaryLogLine:
    message = text[marker.start():].strip()
    body = text[marker.end():]
    fields = {key: value.rstrip(_TRAILING_PUNCTUATION) for key, value in _KEY_VALUE.findall(body)}
    counts = {word: int(number) for number, word in _NUMBER_WORD.findall(body)}
    for key, value in fields.items():
        if re.fullmatch(r"-?\d+", value):
            counts[key] = int(value)
    return CanaryLogLine(text=text, message=message, fields=MappingProxyType(fields),
                         counts=MappingProxyType(counts))


def parse_canary_log(text: str) -> CanaryLogSummary:
    """Classify every canary line of a server log (see the module docstring)."""
    startup: list[CanaryLogLine] = []
    stats: list[CanaryLogLine] = []
    health_ok: list[CanaryLogLine] = []
    violations: list[CanaryLogLine] = []
    notices: list[str] = []
    for line in text.splitlines():
        if not _MENTION.search(line):
            continue
        for pattern, found in ((_VIOLATION, violations), (_STATS, stats),
                               (_HEALTH_OK, health_ok), (_STARTUP, startup)):
            marker = pattern.search(line)
            if marker is not None:
                found.append(_parse_line(line, marker))
                break
        else:
            if _WORD_MENTION.search(line) and not _LOADER_BOOKKEEPING.search(line):
                notices.append(line)
    return CanaryLogSummary(startup=tuple(startup), stats=tuple(stats),
                            health_ok=tuple(health_ok), violations=tuple(violations),
                            notices=tuple(notices))
