"""Pytest plugin: real-server fixtures for the end-to-end (``gpu``) tests.

Loaded by ``test/registered/conftest.py`` so that every test directory sees it.

* ``tiny_model_dir`` / ``tiny_eagle_draft_dir`` / ``tiny_gpt_oss_dir`` / ``tiny_deepseek_dir``
  (session): the offline tiny models (Llama, its EAGLE draft, a hybrid sliding-window GPT-OSS,
  an MLA DeepSeek-V2), made once.
* ``canary_server(env=..., args=...)``: launches ``python -m sglang.launch_server`` on the tiny
  model, waits (bounded) until it is ready and returns a
  :class:`~sglang.srt.kv_canary.tools.server.RunningServer`. Only the ``SGLANG_KV_CANARY_*``
  variables given in ``env`` reach the server. At teardown each server's process group is
  killed and its log copied under ``$KV_CANARY_TEST_LOG_DIR/<test>/`` when that variable is
  set; a failing test's report carries the tail of each server log.
* ``shared_servers`` (module): :class:`SharedServers`, one server per configuration for all the
  tests of a module that ask for it (``shared_servers.get(env=..., args=...)``): a server start
  is most of an end-to-end test's time. Only tests whose traffic keeps each other's log
  assertions true may share one. Logs go under ``$KV_CANARY_TEST_LOG_DIR/<module>/``; a failing
  test's report carries the tail of its module's shared servers too.
* ``keep_log(path)``: copy any other log (e.g. the demo's server log) the same way.
* ``expect_launch_failure(env=..., args=..., timeout_s=..., model_dir=...)``: a launch that
  must stop by itself with a non-zero code, fast; returns a
  :class:`~sglang.srt.kv_canary.tools.server.LaunchOutcome` (``returncode``, ``output``,
  ``elapsed_s``).

``$KV_CANARY_TEST_LOG_DIR/server-pgids.txt`` lists every server process group started, so a
wrapper script can kill leftovers if pytest itself is killed.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from sglang.srt.kv_canary.tools.server import (
    LaunchOutcome,
    RunningServer,
    ServerLaunch,
    run_until_exit,
    start_server,
)
from sglang.srt.kv_canary.tools.tiny_model import (
    make_tiny_deepseek_v2,
    make_tiny_eagle_draft,
    make_tiny_gpt_oss,
    make_tiny_model,
)

_SERVERS = pytest.StashKey[list[RunningServer]]()
_SHARED = pytest.StashKey["SharedServers"]()
_READY_TIMEOUT_S = 420.0
_SERVER_MODULE = "sglang.launch_server"
_LOG_TAIL_LINES = 80


def _log_root() -> pathlib.Path | None:
    configured = os.environ.get("KV_CANARY_TEST_LOG_DIR")
    return pathlib.Path(configured) if configured else None


def _test_dir_name(node: pytest.Item | pytest.Collector) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", node.nodeid)[-150:]


def _record_pgid(server: RunningServer) -> None:
    root = _log_root()
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        with (root / "server-pgids.txt").open("a", encoding="utf-8") as registry:
            registry.write(f"{server.pgid}\n")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_model(directory=tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tiny_eagle_draft_dir(tmp_path_factory: pytest.TempPathFactory,
                         tiny_model_dir: pathlib.Path) -> pathlib.Path:
    return make_tiny_eagle_draft(directory=tmp_path_factory.mktemp("tiny_eagle_draft"),
                                 target_dir=tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_gpt_oss_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_gpt_oss(directory=tmp_path_factory.mktemp("tiny_gpt_oss"))


@pytest.fixture(scope="session")
def tiny_deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_deepseek_v2(directory=tmp_path_factory.mktemp("tiny_deepseek"))


def _launch(*, tmp_path: pathlib.Path, model_dir: pathlib.Path,
            env: Mapping[str, str] | None, args: Sequence[str], name: str,
            server_module: str = _SERVER_MODULE) -> ServerLaunch:
    return ServerLaunch(model_dir=model_dir, log_path=tmp_path / f"{name}.log",
                        env=dict(env or {}), args=tuple(args), inherit_canary_env=False,
                        server_module=server_module)


def _keep_log(dir_name: str, log_path: pathlib.Path) -> None:
    """Copy a server log under ``$KV_CANARY_TEST_LOG_DIR/<dir_name>/`` when that is set."""
    root = _log_root()
    if root is None or not log_path.exists():
        return
    destination = root / dir_name
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log_path, destination / log_path.name)


def _start_ready(launch: ServerLaunch, *, ready_timeout_s: float) -> RunningServer:
    """Start ``launch``, record its process group, wait (bounded) until it is ready."""
    server = start_server(launch)
    _record_pgid(server)
    try:
        server.wait_ready(ready_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture
def canary_server(request: pytest.FixtureRequest, tiny_model_dir: pathlib.Path,
                  tmp_path: pathlib.Path) -> Iterator[Callable[..., RunningServer]]:
    """Factory: ``canary_server(env=None, args=(), model_dir=None, ready_timeout_s=420)``."""
    servers: list[RunningServer] = []
    launches: list[ServerLaunch] = []
    request.node.stash[_SERVERS] = servers

    def start(*, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
              model_dir: pathlib.Path | None = None,
              ready_timeout_s: float = _READY_TIMEOUT_S) -> RunningServer:
        launch = _launch(tmp_path=tmp_path, model_dir=model_dir or tiny_model_dir, env=env,
                         args=args, name=f"server-{len(launches)}")
        launches.append(launch)
        server = _start_ready(launch, ready_timeout_s=ready_timeout_s)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    for launch in launches:
        _keep_log(_test_dir_name(request.node), launch.log_path)


_ConfigKey = tuple[tuple[tuple[str, str], ...], tuple[str, ...], str]


class SharedServers:
    """The servers the tests of one module share: one per configuration (env, args, model).

    :meth:`get` returns the running server of a configuration, starting it (bounded wait) for
    the first test that asks; :meth:`release` stops one before the module ends; :meth:`close`
    stops the rest. A server that exited, or a start that failed, fails every later
    :meth:`get` of its configuration at once, with the log tail (no second start).
    """

    def __init__(self, *, log_dir: pathlib.Path, log_dir_name: str, model_dir: pathlib.Path,
                 server_module: str = _SERVER_MODULE) -> None:
        self._log_dir = log_dir
        self._log_dir_name = log_dir_name
        self._model_dir = model_dir
        self._server_module = server_module
        self._running: dict[_ConfigKey, RunningServer] = {}
        self._failed: dict[_ConfigKey, str] = {}
        self._launches: list[ServerLaunch] = []

    def get(self, *, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
            model_dir: pathlib.Path | None = None,
            ready_timeout_s: float = _READY_TIMEOUT_S) -> RunningServer:
        """The running server of this configuration (started here, waited for, the first
        time); fails the calling test when that server exited or could not start."""
        model = model_dir or self._model_dir
        key = (tuple(sorted((env or {}).items())), tuple(args), str(model))
        if key in self._failed:
            pytest.fail(self._failed[key])
        server = self._running.get(key)
        if server is None:
            server = self._start(key=key, env=env, args=args, model_dir=model,
                                 ready_timeout_s=ready_timeout_s)
        if server.returncode is not None:
            self._failed[key] = (f"the shared server {server.launch.log_path.name} exited with "
                                 f"code {server.returncode} during an earlier test; log tail:\n"
                                 f"{server.log_tail(_LOG_TAIL_LINES)}")
            pytest.fail(self._failed[key])
        return server

    def release(self, server: RunningServer) -> None:
        """Stop ``server`` now (idempotent); a later :meth:`get` of its configuration fails."""
        server.stop()
        for key, running in self._running.items():
            if running is server:
                self._failed[key] = (f"the shared server {server.launch.log_path.name} was "
                                     "released by an earlier test")

    def alive(self) -> list[RunningServer]:
        """The servers started and not yet released or exited."""
        return [s for s in self._running.values() if s.returncode is None]

    def close(self) -> None:
        """Stop every server; copy their logs under ``$KV_CANARY_TEST_LOG_DIR/<module>/``."""
        for server in self._running.values():
            server.stop()
        for launch in self._launches:
            _keep_log(self._log_dir_name, launch.log_path)

    def _start(self, *, key: _ConfigKey, env: Mapping[str, str] | None, args: Sequence[str],
               model_dir: pathlib.Path, ready_timeout_s: float) -> RunningServer:
        launch = _launch(tmp_path=self._log_dir, model_dir=model_dir, env=env, args=args,
                         name=f"shared-{len(self._launches)}", server_module=self._server_module)
        self._launches.append(launch)
        try:
            server = _start_ready(launch, ready_timeout_s=ready_timeout_s)
        except Exception as error:
            self._failed[key] = f"the shared server {launch.log_path.name} did not start: {error}"
            raise
        self._running[key] = server
        return server


@pytest.fixture(scope="module")
def shared_servers(request: pytest.FixtureRequest, tiny_model_dir: pathlib.Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServers]:
    """The module's :class:`SharedServers` (stopped, logs kept, when its tests are done)."""
    servers = SharedServers(log_dir=tmp_path_factory.mktemp("shared_servers"),
                            log_dir_name=_test_dir_name(request.node), model_dir=tiny_model_dir)
    request.node.stash[_SHARED] = servers
    yield servers
    servers.close()


@pytest.fixture
def keep_log(request: pytest.FixtureRequest) -> Callable[[pathlib.Path], None]:
    """``keep_log(path)``: copy ``path`` under ``$KV_CANARY_TEST_LOG_DIR/<test>/`` if set."""
    return lambda path: _keep_log(_test_dir_name(request.node), pathlib.Path(path))


@pytest.fixture
def expect_launch_failure(request: pytest.FixtureRequest, tiny_model_dir: pathlib.Path,
                          tmp_path: pathlib.Path) -> Callable[..., LaunchOutcome]:
    """Factory: ``expect_launch_failure(env=None, args=(), timeout_s=60, model_dir=None)`` ->
    LaunchOutcome; fails the test when the launch exits 0 or still runs after ``timeout_s``."""
    counter = itertools.count()

    def run(*, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
            timeout_s: float = 60.0, model_dir: pathlib.Path | None = None) -> LaunchOutcome:
        launch = _launch(tmp_path=tmp_path, model_dir=model_dir or tiny_model_dir, env=env,
                         args=args, name=f"failed-launch-{next(counter)}")
        try:
            outcome = run_until_exit(launch, timeout_s=timeout_s)
        except TimeoutError as error:
            pytest.fail(f"the launch was expected to fail fast: {error}")
        finally:
            _keep_log(_test_dir_name(request.node), launch.log_path)
        if outcome.returncode == 0:
            pytest.fail("the launch was expected to fail but exited 0; output tail:\n"
                        + "\n".join(outcome.output.splitlines()[-40:]))
        return outcome

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the tail of every server log of a failed test (its own servers and its module's
    shared ones) to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    module = item.getparent(pytest.Module)
    shared = module.stash[_SHARED].alive() if module is not None and _SHARED in module.stash else []
    for server in [*item.stash.get(_SERVERS, []), *shared]:
        report.sections.append(
            (f"server log tail ({server.launch.log_path})", server.log_tail(_LOG_TAIL_LINES))
        )
