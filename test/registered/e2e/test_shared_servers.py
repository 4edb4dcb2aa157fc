"""The module-shared servers of the end-to-end tests (``SharedServers`` in
``e2e_fixtures.py``), without a GPU: against the launcher's stand-in server
(``tools/fake_sglang_server.py``), one server per configuration, released and exited servers
and failed starts failing later requests at once, and the logs kept at the end."""

import pathlib
import sys

import pytest
from e2e_fixtures import SharedServers

from sglang.srt.kv_canary.tools.server import ServerStartError
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")

_FAKE_SERVER_DIR = pathlib.Path(__file__).resolve().parents[1] / "tools"


def _env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(_FAKE_SERVER_DIR), **extra}


@pytest.fixture
def servers(tmp_path: pathlib.Path):
    shared = SharedServers(log_dir=tmp_path / "logs", log_dir_name="the_module",
                           model_dir=tmp_path, server_module="fake_sglang_server")
    yield shared
    shared.close()


def test_one_server_per_configuration(servers) -> None:
    first = servers.get(env=_env(), args=("--page-size", "16"), ready_timeout_s=30)
    assert servers.get(env=_env(), args=("--page-size", "16")) is first
    other = servers.get(env=_env(), args=("--page-size", "1"), ready_timeout_s=30)
    assert other is not first
    assert servers.alive() == [first, other]


def test_a_released_server_fails_its_later_requests(servers) -> None:
    server = servers.get(env=_env(), ready_timeout_s=30)
    servers.release(server)
    assert server.returncode is not None and servers.alive() == []
    with pytest.raises(pytest.fail.Exception, match="released by an earlier test"):
        servers.get(env=_env())


def test_a_server_that_exited_fails_its_later_requests(servers) -> None:
    server = servers.get(env=_env(), ready_timeout_s=30)
    server.stop()
    with pytest.raises(pytest.fail.Exception, match="exited with code"):
        servers.get(env=_env())


def test_a_failed_start_is_not_tried_again(servers) -> None:
    env = _env(FAKE_SERVER_MODE="exit")
    with pytest.raises(ServerStartError):
        servers.get(env=env, ready_timeout_s=30)
    with pytest.raises(pytest.fail.Exception, match="did not start"):
        servers.get(env=env)


def test_close_stops_every_server_and_keeps_the_logs(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KV_CANARY_TEST_LOG_DIR", str(tmp_path / "kept"))
    shared = SharedServers(log_dir=tmp_path / "logs", log_dir_name="the_module",
                           model_dir=tmp_path, server_module="fake_sglang_server")
    server = shared.get(env=_env(), ready_timeout_s=30)
    shared.close()
    assert server.returncode is not None
    kept = tmp_path / "kept"
    assert "fake server: mode=serve" in (kept / "the_module" / "shared-0.log").read_text()
    pgids = (kept / "server-pgids.txt").read_text().split()
    assert pgids == [str(server.pgid)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
