"""Reading a report file back: every line checked against :mod:`.schema`, or an error that names
the line."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from sglang.srt.kv_canary.report.schema import (
    ABORT,
    CACHE_EVICTION,
    HEADER,
    REQUIRED_KEYS,
    RING_OVERFLOW,
    SCHEMA_VERSION,
    TYPE_KEY,
    VIOLATION,
)

ReportObject = dict[str, Any]


class ReportFormatError(ValueError):
    """The file cannot be read, or a line is not an object of the schema (the message names the
    file and the line number)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportContents:
    """The objects of one report file, by type, each in file order."""

    path: str
    headers: tuple[ReportObject, ...]
    violations: tuple[ReportObject, ...]
    overflows: tuple[ReportObject, ...]
    aborts: tuple[ReportObject, ...] = ()  # abort mode
    evictions: tuple[ReportObject, ...] = ()  # abort mode


# the fields the summary reads, and the JSON types they must have
_FIELD_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    HEADER: {"schema": (int,), "pid": (int,)},
    VIOLATION: {"pid": (int,), "step": (int,), "check": (str,), "reasons": (list,),
                "rid": (str, type(None)), "repeat": (bool,)},
    RING_OVERFLOW: {"pid": (int,), "dropped": (int,)},
    ABORT: {"pid": (int,), "rid": (str,), "cause": (str,)},
    CACHE_EVICTION: {"pid": (int,), "nodes": (int,), "tokens": (int,)},
}


def read_report(path: str | os.PathLike[str]) -> ReportContents:
    """Every object of the report file at ``path``. Blank lines are skipped.

    Raises:
        ReportFormatError: the file cannot be read or is empty, the first object is not a
            header, or a line is not JSON, not an object, of an unknown type, lacks a key of
            its type, holds a value of the wrong type, or comes from a newer schema.
    """
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ReportFormatError(f"cannot read {name}: {reason}") from None
    objects: dict[str, list[ReportObject]] = {kind: [] for kind in REQUIRED_KEYS}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        obj = _parse_line(line, where=f"{name}:{number}")
        if not objects[HEADER] and obj[TYPE_KEY] != HEADER:
            raise ReportFormatError(
                f"{name}:{number}: the first object is a {obj[TYPE_KEY]!r}, not a header (is "
                "this a kv_canary report file?)"
            )
        objects[obj[TYPE_KEY]].append(obj)
    if not objects[HEADER]:
        raise ReportFormatError(f"{name}: the file holds no object (not even a header)")
    return ReportContents(
        path=name, headers=tuple(objects[HEADER]), violations=tuple(objects[VIOLATION]),
        overflows=tuple(objects[RING_OVERFLOW]), aborts=tuple(objects[ABORT]),
        evictions=tuple(objects[CACHE_EVICTION]),
    )


def _parse_line(line: str, *, where: str) -> ReportObject:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ReportFormatError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ReportFormatError(f"{where}: a JSON {type(obj).__name__}, not an object")
    kind = obj.get(TYPE_KEY)
    if kind not in REQUIRED_KEYS:
        known = ", ".join(REQUIRED_KEYS)
        raise ReportFormatError(f"{where}: unknown object type {kind!r} (known: {known})")
    missing = [key for key in REQUIRED_KEYS[kind] if key not in obj]
    if missing:
        raise ReportFormatError(f"{where}: a {kind} object without {', '.join(missing)}")
    for key, types in _FIELD_TYPES[kind].items():
        value = obj[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ReportFormatError(f"{where}: {key}={value!r} has the wrong type")
    if kind == VIOLATION and not all(isinstance(label, str) for label in obj["reasons"]):
        raise ReportFormatError(f"{where}: reasons={obj['reasons']!r} are not all labels")
    if kind == HEADER and obj["schema"] > SCHEMA_VERSION:
        raise ReportFormatError(
            f"{where}: written with schema {obj['schema']}; this tool reads schema "
            f"{SCHEMA_VERSION} (upgrade sglang-kv-canary)"
        )
    return obj
