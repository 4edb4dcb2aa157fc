"""The server a burn-in drives: a running one (``--url``) or one it starts (``--model-path``),
and what the server says about itself (:class:`ServerFacts`).

A started server runs through :func:`sglang.srt.kv_canary.tools.server.start_server` (its own
process group, stdout and stderr in one log file, 127.0.0.1, bounded start) and is stopped when
the :class:`Target` closes. A running server is only attached: its log, when given, is read
from where it ended at attach time.
"""

from __future__ import annotations

import pathlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sglang.srt.kv_canary.burnin.cli import StartSpec
from sglang.srt.kv_canary.tools.server import (
    RunningServer,
    ServerLaunch,
    ServerStartError,
    start_server,
)


class TargetError(RuntimeError):
    """The server could not be started, or its settings were refused (message: why)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerFacts:
    """What ``/server_info`` said (each None where it said nothing usable).

    Attributes:
        available: whether the endpoint answered at all.
        page_size: ``--page-size``.
        chunked_prefill_size: ``--chunked-prefill-size`` (None also when chunking is off).
        max_total_num_tokens: the KV pool's size in tokens.
        max_req_input_len: the longest input the scheduler accepts.
        max_running_requests: ``--max-running-requests`` as resolved.
        model_path: ``--model-path``.
        version: SGLang's version.
    """

    available: bool
    page_size: int | None = None
    chunked_prefill_size: int | None = None
    max_total_num_tokens: int | None = None
    max_req_input_len: int | None = None
    max_running_requests: int | None = None
    model_path: str | None = None
    version: str | None = None


def _positive_int(info: Mapping[str, Any], key: str) -> int | None:
    value = info.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _text(info: Mapping[str, Any], key: str) -> str | None:
    value = info.get(key)
    return value if isinstance(value, str) else None


def facts_from_server_info(info: Mapping[str, Any] | None) -> ServerFacts:
    """The facts of a ``/server_info`` JSON object (None: the endpoint did not answer)."""
    if info is None:
        return ServerFacts(available=False)
    return ServerFacts(
        available=True,
        page_size=_positive_int(info, "page_size"),
        chunked_prefill_size=_positive_int(info, "chunked_prefill_size"),
        max_total_num_tokens=_positive_int(info, "max_total_num_tokens"),
        max_req_input_len=_positive_int(info, "max_req_input_len"),
        max_running_requests=_positive_int(info, "max_running_requests"),
        model_path=_text(info, "model_path"),
        version=_text(info, "version"),
    )


class Target:
    """The server of one burn-in; a context manager that stops a started server on exit.

    Attributes:
        base_url: where to send requests.
        description: one line for the summary.
        log_path: the server's log (None: not known).
        log_owned: the burn-in started the server and writes its log.
        log_start_offset: the log's size when the burn-in began (0 for an owned log); what
            follows it is the burn-in's window.
    """

    def __init__(self, *, base_url: str, description: str, log_path: pathlib.Path | None,
                 log_owned: bool, log_start_offset: int,
                 server: RunningServer | None = None) -> None:
        self.base_url = base_url
        self.description = description
        self.log_path = log_path
        self.log_owned = log_owned
        self.log_start_offset = log_start_offset
        self._server = server

    def exit_status(self) -> str | None:
        """Why a started server is gone (None: it runs, or it is not ours to watch)."""
        if self._server is None:
            return None
        code = self._server.returncode
        return None if code is None else f"the server exited with code {code}"

    def close(self) -> None:
        """Stop a started server (idempotent); nothing for an attached one."""
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def attach(*, url: str, server_log: pathlib.Path | None) -> Target:
    """A running server at ``url``; its log window starts at the log's current end."""
    offset = server_log.stat().st_size if server_log is not None else 0
    return Target(base_url=url, description=f"{url} (running; not started by the burn-in)",
                  log_path=server_log, log_owned=False, log_start_offset=offset)


def start(spec: StartSpec, *, request_timeout_s: float, say: Callable[[str], None]) -> Target:
    """Start the server of ``spec`` and wait (bounded by ``spec.ready_timeout_s``) until it is
    ready.

    Raises:
        TargetError: the launch settings were refused, or the server exited or was not ready
            in time (the message holds its log's tail); the server is stopped first.
    """
    log_path = spec.log_path or pathlib.Path(
        tempfile.mkdtemp(prefix="kv_canary_burnin_")) / "server.log"
    try:
        launch = ServerLaunch(model_dir=spec.model_path, log_path=log_path, env=spec.env,
                              args=spec.server_args, base_args=(), port=spec.port,
                              inherit_canary_env=spec.inherit_canary_env,
                              ready_timeout_s=spec.ready_timeout_s,
                              request_timeout_s=request_timeout_s,
                              server_module=spec.server_module)
    except ValueError as error:
        raise TargetError(f"the server launch was refused: {error}") from None
    env_text = " ".join(f"{name}={value}" for name, value in sorted(spec.env.items()))
    command = " ".join(("python -m", spec.server_module, "--model-path", str(spec.model_path),
                        *spec.server_args))
    say(f"starting {env_text} {command}".replace("  ", " "))
    say(f"server log: {log_path}")
    server = start_server(launch)
    try:
        waited = server.wait_ready()
    except ServerStartError as error:
        server.stop()
        raise TargetError(str(error)) from None
    except BaseException:
        server.stop()
        raise
    say(f"server ready at {server.base_url} after {waited:.0f} s (process group {server.pgid})")
    return Target(base_url=server.base_url, description=f"{server.base_url} (started: {command})",
                  log_path=log_path, log_owned=True, log_start_offset=0, server=server)
