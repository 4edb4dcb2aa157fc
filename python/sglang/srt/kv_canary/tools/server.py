"""Launch and manage a real ``python -m sglang.launch_server`` subprocess.

:func:`start_server` starts the server in a new session (``setsid``: it leads its own process
group, so :meth:`RunningServer.stop` can kill the scheduler and detokenizer processes with it),
with stdout and stderr in one log file, listening on 127.0.0.1 only, on a free port picked here
unless one is given, with a torch.distributed port (``--nccl-port``) picked here too unless the
launch sets one; both lie below Linux's ephemeral port range, so servers started side by side do
not race outgoing connections for them. Every wait is bounded. :func:`run_until_exit` runs a
launch that is expected to stop by itself (a refused configuration) and returns its exit code and
output.

The server's environment comes from :func:`.environment.child_environment` (this process's
environment plus ``ServerLaunch.env``). Linux only (process groups, ``/proc``).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sglang.srt.kv_canary.tools.environment import child_environment

HOST = "127.0.0.1"

# Flags that serve the tiny dummy-weight model fast and reliably on one GPU: Triton attention
# with CUDA graphs, no piecewise CUDA graph (it waits for a flashinfer JIT), no grammar backend
# (xgrammar is not in the GPU bundle), the plain PyTorch sampler (no JIT), a capped KV pool.
# Later flags in ``ServerLaunch.args`` win.
TINY_MODEL_SERVER_ARGS: tuple[str, ...] = (
    "--load-format", "dummy",
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--disable-piecewise-cuda-graph",
    "--cuda-graph-max-bs", "64",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "131072",
)
_MANAGED_FLAGS = ("--model-path", "--model", "--host", "--port")
_LOG_TAIL_LINES = 60


class ServerStartError(RuntimeError):
    """The server exited before it was ready, or was not ready in time (message: log tail)."""


class ServerRequestError(RuntimeError):
    """An HTTP request to the server failed (message: method, path, status, body)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLaunch:
    """How to launch one server.

    Attributes:
        model_dir: the model directory (``--model-path``); must exist.
        log_path: where the server's stdout and stderr go (parents are created; overwritten).
        env: environment variables set for the server, over the inherited environment.
        args: extra ``launch_server`` flags, after ``base_args`` (argparse: the later flag wins).
        base_args: the default flags, :data:`TINY_MODEL_SERVER_ARGS`.
        port: the HTTP port; None picks a free one at start.
        inherit_canary_env: whether ``SGLANG_KV_CANARY_*`` variables of this process reach the
            server (False: only those in ``env`` do, so a test controls the canary fully).
        ready_timeout_s: default bound of :meth:`RunningServer.wait_ready`.
        request_timeout_s: bound of each HTTP request.
        stop_timeout_s: how long :meth:`RunningServer.stop` lets SIGTERM work before SIGKILL.
        server_module: the module run with ``python -m``.
    """

    model_dir: pathlib.Path
    log_path: pathlib.Path
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    base_args: tuple[str, ...] = TINY_MODEL_SERVER_ARGS
    port: int | None = None
    inherit_canary_env: bool = False
    ready_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    stop_timeout_s: float = 20.0
    server_module: str = "sglang.launch_server"

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", pathlib.Path(self.model_dir))
        object.__setattr__(self, "log_path", pathlib.Path(self.log_path))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "base_args", tuple(self.base_args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if not self.model_dir.is_dir():
            raise ValueError(f"model_dir={str(self.model_dir)!r} is not a directory")
        for name, value in self.env.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(f"env[{name!r}]={value!r} is invalid; allowed: str -> str")
        for argument in self.args + self.base_args:
            if not isinstance(argument, str):
                raise ValueError(f"argument {argument!r} is invalid; allowed: str")
            if argument.split("=", 1)[0] in _MANAGED_FLAGS:
                raise ValueError(f"argument {argument!r} is set by the launcher; use "
                                 "ServerLaunch.model_dir / ServerLaunch.port instead")
        if self.port is not None and not (isinstance(self.port, int) and 1 <= self.port <= 65535):
            raise ValueError(f"port={self.port!r} is invalid; allowed: None or 1..65535")
        for name in ("ready_timeout_s", "request_timeout_s", "stop_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r} is invalid; allowed: a number > 0")

    def command(self, *, port: int, nccl_port: int | None = None) -> list[str]:
        """The full command line for ``port`` (and ``--nccl-port nccl_port`` when given)."""
        nccl = ["--nccl-port", str(nccl_port)] if nccl_port is not None else []
        return [sys.executable, "-m", self.server_module, "--model-path", str(self.model_dir),
                "--host", HOST, "--port", str(port), *nccl, *self.base_args, *self.args]

    @property
    def sets_nccl_port(self) -> bool:
        return any(argument.split("=", 1)[0] == "--nccl-port" for argument in self.args)

    def child_environment(self) -> dict[str, str]:
        """This process's environment (canary variables only if inherited) plus ``env``."""
        return child_environment(overrides={"PYTHONUNBUFFERED": "1", **self.env},
                                 inherit_canary_env=self.inherit_canary_env)


# SGLang derives more ports from --port (its gRPC port is --port + 10000, and a few more follow
# --port), so candidates come from a range that leaves room above. Every port picked here stays
# below Linux's default ephemeral range (32768-60999): a port picked there can be taken by any
# outgoing connection before the server binds it, which is how SGLang's own pick of the
# torch.distributed port (an ephemeral one) collided when several servers started at once.
_PORT_RANGE = range(20000, 22768)
_DERIVED_PORT_OFFSETS = (0, 1, 2, 10000)
_NCCL_PORT_RANGE = range(10000, 20000)


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(*, candidates: range = _PORT_RANGE,
              offsets: tuple[int, ...] = _DERIVED_PORT_OFFSETS) -> int:
    """A TCP port of ``candidates`` on 127.0.0.1 that is free now, together with the ports at
    ``offsets`` from it (by default: an HTTP port and the ports SGLang derives from it)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(candidates)
        if all(_is_free(port + offset) for offset in offsets):
            return port
    raise RuntimeError(f"no free port in {candidates} (with +{offsets}) on {HOST}")


def _live_group_members(pgid: int) -> list[int]:
    """Pids of processes of group ``pgid`` that are not zombies (read from ``/proc``)."""
    members = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process went away
            continue
        state, _parent, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


class RunningServer:
    """A launched server process group; a context manager that stops it on exit."""

    def __init__(self, *, launch: ServerLaunch, process: subprocess.Popen[bytes],
                 port: int) -> None:
        self.launch = launch
        self.port = port
        self.base_url = f"http://{HOST}:{port}"
        self._process = process
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def pgid(self) -> int:
        """The process group (the server leads it: started with setsid)."""
        return self._process.pid

    def live_pids(self) -> list[int]:
        """The pids of the server's processes that are still alive (its process group)."""
        return _live_group_members(self.pgid)

    @property
    def returncode(self) -> int | None:
        """The launcher's exit code, or None while it runs."""
        return self._process.poll()

    def wait_exit(self, timeout_s: float) -> int:
        """Wait at most ``timeout_s`` for the launcher to exit; its exit code.

        Raises:
            subprocess.TimeoutExpired: it still runs.
        """
        return self._process.wait(timeout=timeout_s)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ logs
    def log_text(self) -> str:
        """Everything the server wrote so far."""
        try:
            return self.launch.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # ------------------------------------------------------------------ readiness
    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Wait until ``GET /health`` answers 200 (SGLang's warm-up is done).

        Returns:
            The seconds waited.

        Raises:
            ServerStartError: the launcher exited first, or ``timeout_s`` (default
                ``launch.ready_timeout_s``) passed; the message holds the log tail.
        """
        bound = self.launch.ready_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            if self.returncode is not None:
                raise ServerStartError(
                    f"the server exited with code {self.returncode} before it was ready "
                    f"(after {waited:.0f} s); log {self.launch.log_path}, tail:\n{self.log_tail()}"
                )
            if waited > bound:
                raise ServerStartError(
                    f"the server was not ready after {bound:.0f} s; log "
                    f"{self.launch.log_path}, tail:\n{self.log_tail()}"
                )
            try:
                status, _ = self._call("GET", "/health", None, timeout_s=5.0)
            except (urllib.error.URLError, http.client.HTTPException, OSError):
                status = 0
            if status == 200:
                return waited
            time.sleep(1.0)

    # ------------------------------------------------------------------ HTTP
    def _call(self, method: str, path: str, payload: object | None, *,
              timeout_s: float) -> tuple[int, bytes]:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with self._opener.open(request, timeout=timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def _reachable_call(self, method: str, path: str, payload: object | None) -> tuple[int, bytes]:
        """``_call`` bounded by ``request_timeout_s``; an unreachable server is an error."""
        try:
            return self._call(method, path, payload, timeout_s=self.launch.request_timeout_s)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            raise ServerRequestError(
                f"{method} {path} failed: {error}; server exit code {self.returncode}; log "
                f"tail:\n{self.log_tail(20)}"
            ) from None

    def request_json(self, method: str, path: str, payload: object | None = None) -> Any:
        """Send one request; return the decoded JSON body (None when the body is empty).

        Raises:
            ServerRequestError: the status is not 200 or the server cannot be reached.
        """
        status, body = self._reachable_call(method, path, payload)
        if status != 200:
            raise ServerRequestError(
                f"{method} {path} answered {status}: {body[:2000].decode(errors='replace')}"
            )
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body.decode(errors="replace")

    def generate(self, payload: Mapping[str, object]) -> Any:
        """``POST /generate``: a dict for one prompt, a list of dicts for a batch payload."""
        return self.request_json("POST", "/generate", dict(payload))

    def generate_many(self, payloads: Sequence[Mapping[str, object]], *,
                      concurrency: int) -> list[Any]:
        """Send every payload with at most ``concurrency`` in flight; results in input order.

        Raises:
            ServerRequestError: the first request that failed.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency!r} is invalid; allowed: an integer >= 1")
        with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(self.generate, payloads))

    def abort(self, rid: str) -> None:
        """``POST /abort_request`` for request id ``rid``."""
        self.request_json("POST", "/abort_request", {"rid": rid})

    def flush_cache(self) -> bool:
        """``POST /flush_cache``; False when SGLang refused (requests still running).

        Raises:
            ServerRequestError: the server cannot be reached.
        """
        status, _ = self._reachable_call("POST", "/flush_cache", None)
        return status == 200

    # ------------------------------------------------------------------ stop
    def stop(self) -> int | None:
        """Kill the whole process group: SIGTERM, then SIGKILL after ``stop_timeout_s``.

        Idempotent; returns once no live process of the group is left (bounded), with the
        launcher's exit code.
        """
        for sig, grace_s in ((signal.SIGTERM, self.launch.stop_timeout_s), (signal.SIGKILL, 30.0)):
            if not _live_group_members(self.pgid):
                break
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                self._process.poll()  # reap the leader
                if not _live_group_members(self.pgid):
                    break
                time.sleep(0.2)
        try:
            return self._process.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            return None


def start_server(launch: ServerLaunch) -> RunningServer:
    """Start the server in its own session; do not wait for it (see ``wait_ready``)."""
    port = launch.port if launch.port is not None else free_port()
    nccl_port = None if launch.sets_nccl_port else free_port(candidates=_NCCL_PORT_RANGE,
                                                             offsets=(0,))
    command = launch.command(port=port, nccl_port=nccl_port)
    launch.log_path.parent.mkdir(parents=True, exist_ok=True)
    with launch.log_path.open("wb") as log:
        log.write(f"[kv_canary.tools.server] command: {' '.join(command)}\n".encode())
        log.flush()
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=launch.child_environment(), start_new_session=True,
        )
    return RunningServer(launch=launch, process=process, port=port)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchOutcome:
    """How a launch that stopped by itself ended."""

    returncode: int
    output: str  # the log: stdout and stderr interleaved
    elapsed_s: float


def run_until_exit(launch: ServerLaunch, *, timeout_s: float) -> LaunchOutcome:
    """Start ``launch`` and wait, at most ``timeout_s``, for it to exit by itself.

    Raises:
        TimeoutError: it still ran after ``timeout_s`` (it is killed first; message: log tail).
    """
    started = time.monotonic()
    server = start_server(launch)
    try:
        returncode = server.wait_exit(timeout_s)
    except subprocess.TimeoutExpired:
        server.stop()
        raise TimeoutError(
            f"the launch still ran after {timeout_s:.0f} s (killed); log tail:\n{server.log_tail()}"
        ) from None
    elapsed = time.monotonic() - started
    server.stop()  # children of a launcher that exited
    return LaunchOutcome(returncode=returncode, output=server.log_text(), elapsed_s=elapsed)
