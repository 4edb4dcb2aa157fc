"""HTTP calls of the burn-in to SGLang's native endpoints, each bounded in time.

One connection per call (``http.client``, no proxy, no keep-alive), so that a client that goes
away closes exactly one request's socket. Every blocking socket operation is bounded by the
client's timeout (or the call's own); a call that cannot reach the server, or times out, raises
:class:`ClientError` naming the method, the path and the cause. An HTTP error status is not an
exception: the caller judges the :class:`Answer`.

Endpoints (sglang 0.5.12): ``POST /generate``, ``POST /abort_request`` (``{"rid": ...}``),
``POST /flush_cache`` (GET and POST both accepted; 200 flushed, 400 refused while requests
run), ``GET /server_info`` (``/get_server_info`` on older servers), ``GET /health_generate``.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_STREAM_DONE = b"data: [DONE]"


class ClientError(RuntimeError):
    """A call could not reach the server or timed out (message: method, path, cause)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """What the server answered: the HTTP status and the whole body."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return self.status == 200

    def json(self) -> Any:
        """The body decoded as JSON.

        Raises:
            ValueError: the body is not JSON.
        """
        return json.loads(self.body)

    def excerpt(self, limit: int = 300) -> str:
        """The start of the body as text (for messages)."""
        text = self.body[:limit].decode(errors="replace").strip()
        return text + ("..." if len(self.body) > limit else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveOutcome:
    """A request whose client went away.

    Attributes:
        answer: the server's answer when it came before the client left (a streamed request:
            only when the status was not 200), else None.
        events: streamed ``data:`` events read before leaving.
        finished: the answer (or the stream's ``[DONE]``) arrived before the client left.
    """

    answer: Answer | None
    events: int
    finished: bool


class Client:
    """Calls to one server at ``base_url`` (``http[s]://host[:port][/base]``)."""

    def __init__(self, *, base_url: str, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url={base_url!r} is invalid; allowed: http[s]://HOST[:PORT]")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} is invalid; allowed: a number > 0")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base_path = parts.path.rstrip("/")

    # ------------------------------------------------------------------ plumbing
    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=timeout_s)

    def _send(self, connection: http.client.HTTPConnection, method: str, path: str,
              payload: object | None) -> None:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, self._base_path + path, body=body, headers=headers)

    def call(self, method: str, path: str, payload: object | None = None, *,
             timeout_s: float | None = None) -> Answer:
        """Send one request and read the whole answer.

        Raises:
            ClientError: the server cannot be reached, or a socket operation outlasted
                ``timeout_s`` (default: the client's).
        """
        connection = self._connection(self.timeout_s if timeout_s is None else timeout_s)
        try:
            self._send(connection, method, path, payload)
            response = connection.getresponse()
            return Answer(status=response.status, body=response.read())
        except (OSError, http.client.HTTPException) as error:
            raise ClientError(f"{method} {self.base_url}{path} failed: "
                              f"{type(error).__name__}: {error}") from None
        finally:
            connection.close()

    # ------------------------------------------------------------------ endpoints
    def generate(self, payload: Mapping[str, object]) -> Answer:
        """``POST /generate`` (not streamed)."""
        return self.call("POST", "/generate", dict(payload))

    def abort(self, rid: str) -> Answer:
        """``POST /abort_request`` for ``rid`` (SGLang aborts every request whose rid starts
        with it)."""
        return self.call("POST", "/abort_request", {"rid": rid})

    def flush_cache(self) -> Answer:
        """``POST /flush_cache``: 200 flushed, 400 refused (requests in flight)."""
        return self.call("POST", "/flush_cache")

    def health(self, *, timeout_s: float) -> Answer:
        """``GET /health_generate``: 200 when the server answered a one-token generation (or
        was busy serving), 503 otherwise."""
        return self.call("GET", "/health_generate", timeout_s=timeout_s)

    def server_info(self) -> dict[str, Any] | None:
        """``GET /server_info`` (or ``/get_server_info``): the server's arguments and limits;
        None when neither answers a JSON object.

        Raises:
            ClientError: the server cannot be reached.
        """
        for path in ("/server_info", "/get_server_info"):
            answer = self.call("GET", path)
            if answer.ok:
                try:
                    info = answer.json()
                except ValueError:
                    continue
                if isinstance(info, dict):
                    return info
        return None

    def generate_then_leave(self, payload: Mapping[str, object], *, after_s: float,
                            streaming: bool) -> LeaveOutcome:
        """Send ``payload`` and go away (close the connection) after ``after_s`` seconds.

        Streamed: the events are read until ``after_s`` passed and at least one arrived, then
        the connection is closed. Plain: the answer is awaited for ``after_s`` only.

        Raises:
            ClientError: the server cannot be reached, or a streamed event outlasted the
                client's timeout.
        """
        started = time.monotonic()
        path = "/generate"
        body = {**payload, "stream": True} if streaming else dict(payload)
        connection = self._connection(self.timeout_s)
        try:
            self._send(connection, "POST", path, body)
            if not streaming and connection.sock is not None:
                connection.sock.settimeout(max(after_s, 0.001))  # connected: now wait after_s
            try:
                response = connection.getresponse()
            except TimeoutError:
                return LeaveOutcome(answer=None, events=0, finished=False)  # the plain case
            if not streaming or response.status != 200:
                return LeaveOutcome(answer=Answer(status=response.status, body=response.read()),
                                    events=0, finished=True)
            events = 0
            while True:
                line = response.readline()
                if not line:
                    return LeaveOutcome(answer=None, events=events, finished=True)
                if line.startswith(_STREAM_DONE):
                    return LeaveOutcome(answer=None, events=events, finished=True)
                if line.startswith(b"data:"):
                    events += 1
                    if time.monotonic() - started >= after_s:
                        return LeaveOutcome(answer=None, events=events, finished=False)
        except (OSError, http.client.HTTPException) as error:
            raise ClientError(f"POST {self.base_url}{path} (stream={streaming}) failed: "
                              f"{type(error).__name__}: {error}") from None
        finally:
            connection.close()
