"""Pytest plugin: real-server fixtures for the end-to-end (``gpu``) tests.

Loaded by ``test/registered/conftest.py`` so that every test directory sees it.

* ``tiny_model_dir`` / ``tiny_eagle_draft_dir`` (session): the offline tiny model, made once.
* ``canary_server(env=..., args=...)``: launches ``python -m sglang.launch_server`` on the tiny
  model, waits (bounded) until it is ready and returns a
  :class:`~sglang.srt.kv_canary.tools.server.RunningServer`. Only the ``SGLANG_KV_CANARY_*``
  variables given in ``env`` reach the server. At teardown each server's process group is
  killed and its log copied under ``$KV_CANARY_TEST_LOG_DIR/<test>/`` when that variable is
  set; a failing test's report carries the tail of each server log.
* ``keep_log(path)``: copy any other log (e.g. the demo's server log) the same way.
* ``expect_launch_failure(env=..., args=..., timeout_s=...)``: a launch that must stop by
  itself with a non-zero code, fast; returns a
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
from sglang.srt.kv_canary.tools.tiny_model import make_tiny_eagle_draft, make_tiny_model

_SERVERS = pytest.StashKey[list[RunningServer]]()
_READY_TIMEOUT_S = 420.0
_LOG_TAIL_LINES = 80


def _log_root() -> pathlib.Path | None:
    configured = os.environ.get("KV_CANARY_TEST_LOG_DIR")
    return pathlib.Path(configured) if configured else None


def _test_dir_name(item: pytest.Item) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[-150:]


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


def _launch(*, tmp_path: pathlib.Path, model_dir: pathlib.Path,
            env: Mapping[str, str] | None, args: Sequence[str], name: str) -> ServerLaunch:
    return ServerLaunch(model_dir=model_dir, log_path=tmp_path / f"{name}.log",
                        env=dict(env or {}), args=tuple(args), inherit_canary_env=False)


def _keep_log(item: pytest.Item, log_path: pathlib.Path) -> None:
    """Copy a server log under ``$KV_CANARY_TEST_LOG_DIR/<test>/`` when that is set."""
    root = _log_root()
    if root is None or not log_path.exists():
        return
    destination = root / _test_dir_name(item)
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log_path, destination / log_path.name)


@pytest.fixture
def canary_server(request: pytest.FixtureRequest, tiny_model_dir: pathlib.Path,
                  tmp_path: pathlib.Path) -> Iterator[Callable[..., RunningServer]]:
    """Factory: ``canary_server(env=None, args=(), model_dir=None, ready_timeout_s=420)``."""
    servers: list[RunningServer] = []
    request.node.stash[_SERVERS] = servers

    def start(*, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
              model_dir: pathlib.Path | None = None,
              ready_timeout_s: float = _READY_TIMEOUT_S) -> RunningServer:
        launch = _launch(tmp_path=tmp_path, model_dir=model_dir or tiny_model_dir, env=env,
                         args=args, name=f"server-{len(servers)}")
        server = start_server(launch)
        servers.append(server)
        _record_pgid(server)
        server.wait_ready(ready_timeout_s)
        return server

    yield start
    for server in servers:
        server.stop()
        _keep_log(request.node, server.launch.log_path)


@pytest.fixture
def keep_log(request: pytest.FixtureRequest) -> Callable[[pathlib.Path], None]:
    """``keep_log(path)``: copy ``path`` under ``$KV_CANARY_TEST_LOG_DIR/<test>/`` if set."""
    return lambda path: _keep_log(request.node, pathlib.Path(path))


@pytest.fixture
def expect_launch_failure(request: pytest.FixtureRequest, tiny_model_dir: pathlib.Path,
                          tmp_path: pathlib.Path) -> Callable[..., LaunchOutcome]:
    """Factory: ``expect_launch_failure(env=None, args=(), timeout_s=60)`` -> LaunchOutcome;
    fails the test when the launch exits 0 or still runs after ``timeout_s``."""
    counter = itertools.count()

    def run(*, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
            timeout_s: float = 60.0) -> LaunchOutcome:
        launch = _launch(tmp_path=tmp_path, model_dir=tiny_model_dir, env=env, args=args,
                         name=f"failed-launch-{next(counter)}")
        try:
            outcome = run_until_exit(launch, timeout_s=timeout_s)
        except TimeoutError as error:
            pytest.fail(f"the launch was expected to fail fast: {error}")
        finally:
            _keep_log(request.node, launch.log_path)
        if outcome.returncode == 0:
            pytest.fail("the launch was expected to fail but exited 0; output tail:\n"
                        + "\n".join(outcome.output.splitlines()[-40:]))
        return outcome

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the tail of every server log of a failed test to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for server in item.stash.get(_SERVERS, []):
        report.sections.append(
            (f"server log tail ({server.launch.log_path})", server.log_tail(_LOG_TAIL_LINES))
        )
