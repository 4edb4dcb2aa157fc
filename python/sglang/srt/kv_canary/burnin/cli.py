"""The burn-in's command line: arguments in, one frozen :class:`BurninConfig` out.

Everything the burn-in does is decided here, from the arguments alone (a client tool: it reads
no environment variable). ``argv`` is split at the first ``--``: what follows are
``launch_server`` flags for a server the burn-in starts (``--model-path``). Every refusal names
the flag, the value and what is allowed, and exits with code 2 (argparse's ``error``).
"""

from __future__ import annotations

import argparse
import pathlib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NoReturn, TypeVar

from sglang.srt.kv_canary.config import ENV_PREFIX, KNOWN_NAMES

PROG = "python -m sglang.srt.kv_canary.burnin"
DEFAULT_DURATION_S = 300.0
DEFAULT_CANARY_MODE = "log"
SERVER_MODULE = "sglang.launch_server"
# launch_server flags the burn-in sets itself for a server it starts.
MANAGED_SERVER_FLAGS = ("--model-path", "--model", "--host", "--port")

_MAX_DURATION_S = 7 * 24 * 3600.0
_T = TypeVar("_T", int, float)


class BadInput(ValueError):
    """An argument is invalid; the message names the flag, the value and what is allowed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartSpec:
    """How to start the server the burn-in owns (``--model-path`` mode).

    Attributes:
        model_path: the local model directory (``--model-path`` of ``launch_server``).
        server_args: the ``launch_server`` flags given after ``--``, in order.
        env: variables set for the server (the ``--canary-env`` pairs, plus
            ``SGLANG_KV_CANARY_MODE=log`` unless a mode is given or inherited).
        inherit_canary_env: whether the ``SGLANG_KV_CANARY_*`` variables of the calling shell
            reach the server too (``--inherit-canary-env``).
        port: the HTTP port (None: a free one).
        ready_timeout_s: how long the server may take to become ready.
        log_path: where the server's stdout and stderr go (None: a new temporary folder).
        server_module: the module run with ``python -m`` (tests substitute a stand-in).
    """

    model_path: pathlib.Path
    server_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_canary_env: bool = False
    port: int | None = None
    ready_timeout_s: float = 600.0
    log_path: pathlib.Path | None = None
    server_module: str = SERVER_MODULE

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_path", pathlib.Path(self.model_path))
        object.__setattr__(self, "server_args", tuple(self.server_args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if self.log_path is not None:
            object.__setattr__(self, "log_path", pathlib.Path(self.log_path))


@dataclass(frozen=True, slots=True, kw_only=True)
class BurninConfig:
    """What one burn-in run does; exactly one of ``url`` and ``start`` is set.

    Attributes:
        url: base URL of a running server (``--url``), without a trailing ``/``.
        start: how to start a server (``--model-path``).
        server_log: ``--url`` mode: the running server's log file, read (never written) for
            the canary's lines; None: violations are unknown.
        duration_s: stop sending after this many seconds (None: no time limit).
        max_tokens: stop sending once the answered requests' prompt plus generated tokens
            reach this (None: no token budget). At least one of the two limits is set.
        seed: seed of the request mix (same seed and server facts: same requests).
        concurrency: at most this many actions in flight (a retraction burst counts as one).
        page_size: the page size the prefixes are cut at (None: the server's, else 1).
        max_new_tokens: the longest generation asked for.
        max_prompt_tokens: the longest prompt (None: from the server's limits).
        token_ids: prompt token ids are drawn from ``[low, high)``.
        burst_requests: requests per retraction burst (None: sized from the server's KV pool).
        request_timeout_s: bound of each HTTP call.
        progress_interval_s: seconds between progress lines (0: none).
        health_interval_s: seconds between ``/health_generate`` probes (0: none).
        settle_s: the longest wait after the last answer for the canary's idle line (every
            forward reported), or the wait itself without a log.
    """

    url: str | None = None
    start: StartSpec | None = None
    server_log: pathlib.Path | None = None
    duration_s: float | None = DEFAULT_DURATION_S
    max_tokens: int | None = None
    seed: int = 0
    concurrency: int = 16
    page_size: int | None = None
    max_new_tokens: int = 256
    max_prompt_tokens: int | None = None
    token_ids: tuple[int, int] = (5, 4096)
    burst_requests: int | None = None
    request_timeout_s: float = 300.0
    progress_interval_s: float = 10.0
    health_interval_s: float = 15.0
    settle_s: float = 10.0

    def __post_init__(self) -> None:
        if (self.url is None) == (self.start is None):
            raise BadInput("give exactly one of --url (a running server) and --model-path "
                           "(a server the burn-in starts)")
        if self.start is not None and self.server_log is not None:
            raise BadInput("server_log is for --url mode; a started server's log is "
                           "StartSpec.log_path")
        if self.duration_s is None and self.max_tokens is None:
            raise BadInput("give --duration-s or --max-tokens (or both)")
        if self.server_log is not None:
            object.__setattr__(self, "server_log", pathlib.Path(self.server_log))


# ----------------------------------------------------------------------------- parsing
def _fail(message: str) -> NoReturn:
    raise BadInput(message)


def _number(flag: str, text: str | None, kind: Callable[[str], _T], *, low: _T,
            high: _T | None = None, low_open: bool = False, what: str) -> _T | None:
    """``text`` as ``kind`` within the bounds, or None when the flag was not given."""
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        _fail(f"{flag}={text!r} is invalid; allowed: {what}")
    if value != value or (value <= low if low_open else value < low) or (
            high is not None and value > high):
        _fail(f"{flag}={text!r} is invalid; allowed: {what}")
    return value


def _url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment:
        _fail(f"--url={text!r} is invalid; allowed: http://HOST:PORT or https://HOST:PORT "
              "(a base path is kept; no query or fragment)")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        _fail(f"--url={text!r} is invalid; allowed: a port in 1..65535")
    return text.rstrip("/")


def _token_ids(text: str) -> tuple[int, int]:
    low_text, sep, high_text = text.partition(":")
    what = "LOW:HIGH, integers with 0 <= LOW and LOW + 2 <= HIGH (ids are drawn from [LOW, HIGH))"
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        _fail(f"--token-ids={text!r} is invalid; allowed: {what}")
    if not sep or low < 0 or high < low + 2:
        _fail(f"--token-ids={text!r} is invalid; allowed: {what}")
    return low, high


def _canary_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith(ENV_PREFIX):
            _fail(f"--canary-env={pair!r} is invalid; allowed: {ENV_PREFIX}NAME=VALUE")
        if name not in KNOWN_NAMES:
            _fail(f"--canary-env={pair!r} names an unknown variable {name}; allowed: the "
                  "variables of the README's configuration table "
                  "(python -m sglang.srt.kv_canary.config lists them)")
        env[name] = value
    return env


def _server_args(args: Sequence[str]) -> tuple[str, ...]:
    for argument in args:
        flag = argument.split("=", 1)[0]
        if flag in MANAGED_SERVER_FLAGS:
            own = "--model-path" if flag in ("--model-path", "--model") else flag
            _fail(f"the server flag {argument!r} after -- is set by the burn-in; use the "
                  f"burn-in's own {own} (before --) instead")
    return tuple(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=(f"{PROG} (--url URL [--server-log PATH] | --model-path DIR [...] "
               "[-- LAUNCH_SERVER_FLAGS...]) [options]"),
        description="Drive an SGLang server with a seeded, adversarial but valid request mix "
                    "and report what the KV canary saw. Exit codes: 0 clean, 1 violations, "
                    "2 server failure or bad input.",
    )
    target = parser.add_argument_group("server")
    target.add_argument("--url", help="base URL of a running server, e.g. http://127.0.0.1:30000")
    target.add_argument("--server-log", metavar="PATH",
                        help="--url: the file the server's stdout/stderr go to (without it "
                             "violations are unknown); --model-path: where to write the log")
    target.add_argument("--model-path", metavar="DIR",
                        help="start `python -m sglang.launch_server --model-path DIR` with the "
                             "flags after --, on 127.0.0.1")
    target.add_argument("--port", metavar="N", help="--model-path: the HTTP port (default: free)")
    target.add_argument("--canary-env", metavar="NAME=VALUE", action="append", default=[],
                        help="--model-path: a SGLANG_KV_CANARY_* variable for the server "
                             f"(repeatable; default {ENV_PREFIX}MODE={DEFAULT_CANARY_MODE})")
    target.add_argument("--inherit-canary-env", action="store_true",
                        help="--model-path: also pass this shell's SGLANG_KV_CANARY_* variables")
    target.add_argument("--ready-timeout-s", metavar="S",
                        help="--model-path: bound of the server start (default 600)")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--duration-s", metavar="S",
                        help=f"stop sending after S seconds (default {DEFAULT_DURATION_S:g} "
                             "when --max-tokens is not given)")
    limits.add_argument("--max-tokens", metavar="N",
                        help="stop sending once N prompt plus generated tokens were answered")
    mix = parser.add_argument_group("workload")
    mix.add_argument("--seed", metavar="N", default="0", help="seed of the request mix (0)")
    mix.add_argument("--concurrency", metavar="N", default="16",
                     help="actions in flight at once (16)")
    mix.add_argument("--page-size", metavar="N",
                     help="page size of the shared prefixes (default: the server's, else 1)")
    mix.add_argument("--max-new-tokens", metavar="N", default="256",
                     help="longest generation (256)")
    mix.add_argument("--max-prompt-tokens", metavar="N",
                     help="longest prompt (default: from the server's limits, else 2048)")
    mix.add_argument("--token-ids", metavar="LOW:HIGH", default="5:4096",
                     help="prompt ids are drawn from [LOW, HIGH) (5:4096)")
    mix.add_argument("--burst-requests", metavar="N",
                     help="requests per retraction burst (default: sized from the KV pool)")
    run = parser.add_argument_group("run")
    run.add_argument("--request-timeout-s", metavar="S", default="300",
                     help="bound of each HTTP call (300)")
    run.add_argument("--progress-interval-s", metavar="S", default="10",
                     help="seconds between progress lines on stderr (10; 0: none)")
    run.add_argument("--health-interval-s", metavar="S", default="15",
                     help="seconds between /health_generate probes (15; 0: none)")
    run.add_argument("--settle-s", metavar="S", default="10",
                     help="longest wait after the last answer for the canary's idle line, "
                          "which follows the report of every forward (10)")
    return parser


def _config(options: argparse.Namespace, server_args: Sequence[str] | None) -> BurninConfig:
    positive = "a number > 0"
    if options.url is not None and options.model_path is not None:
        _fail("--url and --model-path exclude each other: give a running server (--url) or "
              "a model to start one (--model-path)")
    if options.url is None and options.model_path is None:
        _fail("give --url URL (a running server) or --model-path DIR (a server to start)")
    started_only = {"--port": options.port, "--ready-timeout-s": options.ready_timeout_s,
                    "--canary-env": options.canary_env or None,
                    "--inherit-canary-env": options.inherit_canary_env or None,
                    "flags after --": server_args}
    start: StartSpec | None = None
    if options.url is not None:
        given = [flag for flag, value in started_only.items() if value is not None]
        if given:
            _fail(f"{', '.join(given)} only apply to a server the burn-in starts "
                  "(--model-path), not to --url")
        server_log = None
        if options.server_log is not None:
            server_log = pathlib.Path(options.server_log)
            if not server_log.is_file():
                _fail(f"--server-log={options.server_log!r} is not a file; allowed: the file "
                      "the running server's stdout/stderr go to")
        url = _url(options.url)
    else:
        model_path = pathlib.Path(options.model_path)
        if not model_path.is_dir():
            _fail(f"--model-path={options.model_path!r} is not a directory; allowed: a local "
                  "model directory")
        env = _canary_env(options.canary_env)
        if f"{ENV_PREFIX}MODE" not in env and not options.inherit_canary_env:
            env[f"{ENV_PREFIX}MODE"] = DEFAULT_CANARY_MODE
        start = StartSpec(
            model_path=model_path, server_args=_server_args(server_args or ()), env=env,
            inherit_canary_env=options.inherit_canary_env,
            port=_number("--port", options.port, int, low=1, high=65535, what="1..65535"),
            ready_timeout_s=_number("--ready-timeout-s", options.ready_timeout_s, float,
                                    low=0.0, low_open=True, what=positive) or 600.0,
            log_path=None if options.server_log is None else pathlib.Path(options.server_log),
        )
        url, server_log = None, None
    duration_s = _number("--duration-s", options.duration_s, float, low=0.0, low_open=True,
                         high=_MAX_DURATION_S, what=f"a number in (0, {_MAX_DURATION_S:g}]")
    max_tokens = _number("--max-tokens", options.max_tokens, int, low=1, what="an integer >= 1")
    if duration_s is None and max_tokens is None:
        duration_s = DEFAULT_DURATION_S

    def at_least(flag: str, text: str, low: int, high: int) -> int:
        value = _number(flag, text, int, low=low, high=high, what=f"an integer in [{low}, {high}]")
        assert value is not None
        return value

    def seconds(flag: str, text: str, *, zero_allowed: bool) -> float:
        what = "a number >= 0" if zero_allowed else positive
        value = _number(flag, text, float, low=0.0, low_open=not zero_allowed, high=_MAX_DURATION_S,
                        what=what)
        assert value is not None
        return value

    return BurninConfig(
        url=url, start=start, server_log=server_log, duration_s=duration_s,
        max_tokens=max_tokens,
        seed=at_least("--seed", options.seed, 0, 2**63 - 1),
        concurrency=at_least("--concurrency", options.concurrency, 1, 1024),
        page_size=_number("--page-size", options.page_size, int, low=1, high=4096,
                          what="an integer in [1, 4096]"),
        max_new_tokens=at_least("--max-new-tokens", options.max_new_tokens, 1, 1_000_000),
        max_prompt_tokens=_number("--max-prompt-tokens", options.max_prompt_tokens, int, low=8,
                                  high=10_000_000, what="an integer in [8, 10000000]"),
        token_ids=_token_ids(options.token_ids),
        burst_requests=_number("--burst-requests", options.burst_requests, int, low=1,
                               high=4096, what="an integer in [1, 4096]"),
        request_timeout_s=seconds("--request-timeout-s", options.request_timeout_s,
                                  zero_allowed=False),
        progress_interval_s=seconds("--progress-interval-s", options.progress_interval_s,
                                    zero_allowed=True),
        health_interval_s=seconds("--health-interval-s", options.health_interval_s,
                                  zero_allowed=True),
        settle_s=seconds("--settle-s", options.settle_s, zero_allowed=True),
    )


def parse_config(argv: Sequence[str]) -> BurninConfig:
    """The configuration of ``argv`` (the arguments after the program name).

    Raises:
        SystemExit: code 2, after printing the usage and what is wrong (argparse's error).
    """
    argv = list(argv)
    server_args: list[str] | None = None
    if "--" in argv:
        split = argv.index("--")
        argv, server_args = argv[:split], argv[split + 1:]
    parser = build_parser()
    options = parser.parse_args(argv)
    try:
        return _config(options, server_args)
    except BadInput as error:
        parser.error(str(error))
