"""The burn-in's command line: what it accepts, what it refuses (exit 2, naming the flag, the
value and what is allowed), and the frozen configuration it builds."""

import dataclasses
import pathlib
import sys

import pytest

from sglang.srt.kv_canary.burnin.cli import (
    DEFAULT_DURATION_S,
    BadInput,
    BurninConfig,
    StartSpec,
    parse_config,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

URL = "http://127.0.0.1:30000"


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        parse_config(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err


def test_url_mode_defaults() -> None:
    config = parse_config(["--url", URL + "/"])
    assert config.url == URL and config.start is None and config.server_log is None
    assert config.duration_s == DEFAULT_DURATION_S and config.max_tokens is None
    assert (config.seed, config.concurrency, config.page_size, config.token_ids) == (
        0, 16, None, (5, 4096))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1  # type: ignore[misc]


def test_url_mode_with_a_log_and_limits(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    config = parse_config(["--url", URL, "--server-log", str(log), "--max-tokens", "1000",
                           "--seed", "7", "--page-size", "16", "--token-ids", "10:500",
                           "--progress-interval-s", "0"])
    assert config.server_log == log and config.max_tokens == 1000
    assert config.duration_s is None  # only the token budget was given
    assert (config.seed, config.page_size, config.token_ids) == (7, 16, (10, 500))
    assert config.progress_interval_s == 0


def test_started_mode_passes_the_flags_after_the_separator(tmp_path: pathlib.Path) -> None:
    config = parse_config(["--model-path", str(tmp_path), "--duration-s", "120",
                           "--canary-env", "SGLANG_KV_CANARY_REAL_DATA=partial", "--",
                           "--page-size", "16", "--enable-mixed-chunk"])
    assert config.url is None and isinstance(config.start, StartSpec)
    assert config.start.server_args == ("--page-size", "16", "--enable-mixed-chunk")
    assert dict(config.start.env) == {"SGLANG_KV_CANARY_REAL_DATA": "partial",
                                      "SGLANG_KV_CANARY_MODE": "log"}
    assert config.page_size is None  # the burn-in's own --page-size was not given
    assert config.duration_s == 120.0


def test_started_mode_keeps_a_given_mode_and_adds_none_when_inheriting(
        tmp_path: pathlib.Path) -> None:
    raise_mode = parse_config(["--model-path", str(tmp_path), "--canary-env",
                               "SGLANG_KV_CANARY_MODE=raise"])
    assert raise_mode.start is not None
    assert dict(raise_mode.start.env) == {"SGLANG_KV_CANARY_MODE": "raise"}
    inherit = parse_config(["--model-path", str(tmp_path), "--inherit-canary-env"])
    assert inherit.start is not None
    assert dict(inherit.start.env) == {} and inherit.start.inherit_canary_env


@pytest.mark.parametrize(
    "argv, fragment",
    [
        ([], "give --url URL"),
        (["--url", URL, "--model-path", "/tmp"], "--url and --model-path exclude each other"),
        (["--url", "ftp://x"], "--url='ftp://x' is invalid; allowed: http://HOST:PORT"),
        (["--url", "http://h:99999"], "allowed: a port in 1..65535"),
        (["--url", URL, "--concurrency", "0"], "--concurrency='0' is invalid; allowed: an "
                                               "integer in [1, 1024]"),
        (["--url", URL, "--concurrency", "many"], "--concurrency='many' is invalid"),
        (["--url", URL, "--duration-s", "-1"], "--duration-s='-1' is invalid; allowed: a number"),
        (["--url", URL, "--duration-s", "nan"], "--duration-s='nan' is invalid"),
        (["--url", URL, "--max-tokens", "0"], "--max-tokens='0' is invalid; allowed: an "
                                              "integer >= 1"),
        (["--url", URL, "--page-size", "0"], "--page-size='0' is invalid"),
        (["--url", URL, "--token-ids", "5"], "--token-ids='5' is invalid; allowed: LOW:HIGH"),
        (["--url", URL, "--token-ids", "10:11"], "--token-ids='10:11' is invalid"),
        (["--url", URL, "--request-timeout-s", "0"], "--request-timeout-s='0' is invalid; "
                                                     "allowed: a number > 0"),
        (["--url", URL, "--settle-s", "-0.5"], "--settle-s='-0.5' is invalid; allowed: a "
                                               "number >= 0"),
        (["--url", URL, "--server-log", "/no/such/log"], "--server-log='/no/such/log' is not "
                                                          "a file"),
        (["--url", URL, "--port", "8000"], "--port only apply to a server the burn-in starts"),
        (["--url", URL, "--", "--page-size", "16"], "flags after -- only apply"),
        (["--url", URL, "--canary-env", "SGLANG_KV_CANARY_MODE=log"], "--canary-env only apply"),
        (["--model-path", "/no/such/model"], "--model-path='/no/such/model' is not a directory"),
    ],
)
def test_bad_arguments_are_refused_with_exit_code_2(argv, fragment, capsys) -> None:
    assert fragment in _refused(argv, capsys)


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--canary-env", "MODE=log"], "--canary-env='MODE=log' is invalid; allowed: "
                                       "SGLANG_KV_CANARY_NAME=VALUE"),
        (["--canary-env", "SGLANG_KV_CANARY_MOD=log"], "unknown variable SGLANG_KV_CANARY_MOD"),
        (["--port", "0"], "--port='0' is invalid; allowed: 1..65535"),
        (["--ready-timeout-s", "0"], "--ready-timeout-s='0' is invalid"),
        (["--", "--port", "1234"], "the server flag '--port' after -- is set by the burn-in; "
                                   "use the burn-in's own --port"),
        (["--", "--model-path=/x"], "use the burn-in's own --model-path"),
        (["--", "--host", "0.0.0.0"], "the server flag '--host' after -- is set by the burn-in"),
    ],
)
def test_bad_started_mode_arguments_are_refused(extra, fragment, tmp_path, capsys) -> None:
    assert fragment in _refused(["--model-path", str(tmp_path), *extra], capsys)


def test_the_config_type_refuses_inconsistent_values(tmp_path: pathlib.Path) -> None:
    with pytest.raises(BadInput, match="exactly one of --url"):
        BurninConfig()
    with pytest.raises(BadInput, match="--duration-s or --max-tokens"):
        BurninConfig(url=URL, duration_s=None, max_tokens=None)
    with pytest.raises(BadInput, match="server_log is for --url mode"):
        BurninConfig(start=StartSpec(model_path=tmp_path), server_log=tmp_path / "x.log")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
