"""The main job: SGLang with the KV canary on a built-in tiny model, and what the canary saw.

``python -m sglang.srt.kv_canary.demo [--requests N] [--port P] [--keep-server]``

With a CUDA GPU: writes the tiny dummy-weight model, launches ``python -m
sglang.launch_server`` with ``SGLANG_KV_CANARY_MODE=log`` (plus the token oracle and its
``token_oracle`` sampling backend when this installation has them), sends a short mixed
workload (shared prefixes, long chunked prompts, short text prompts, exact repeats, a replay
after flushing the radix cache), then prints the canary's start-up line, its latest stats line,
every violation and any other canary message from the server log. Other ``SGLANG_KV_CANARY_*``
variables of the calling shell reach the server (e.g. ``SGLANG_KV_CANARY_REAL_DATA=partial``).

Without a CUDA GPU: runs the CPU self-check (``python -m sglang.srt.kv_canary.selfcheck``).

Exit codes: 0 the canary ran (start-up line, slots verified per its stats line, at least one
passed health check) and saw no violation, or the self-check passed; 1 violations, or no proof
that the canary checked anything; 2 no GPU and no self-check installed; 3 the server failed;
otherwise the self-check's own code.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sglang.srt.kv_canary.monitor.stats import STATS_LINE_RE
from sglang.srt.kv_canary.tools.canary_log import (
    CanaryLogLine,
    CanaryLogSummary,
    parse_canary_log,
)

if TYPE_CHECKING:
    from sglang.srt.kv_canary.tools.server import RunningServer

SELFCHECK_MODULE = "sglang.srt.kv_canary.selfcheck"
TOKEN_ORACLE_MODULE = "sglang.srt.kv_canary.token_oracle"
NO_GPU_MESSAGE = "no CUDA GPU visible: running the CPU self-check instead"

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_NO_SELFCHECK, EXIT_SERVER_FAILED = 0, 1, 2, 3

_VOCAB_SIZE = 4096
_CONTEXT_LENGTH = 4096
_MAX_NEW_TOKENS = 64
_LONG_PROMPT_TOKENS = (1500, 3000)
_SHARED_PREFIX_TOKENS = (256, 640, 1200)
_REPLAYED_AFTER_FLUSH = 8
_STATS_EVERY_N_STEPS = "20"
_TEXT_WORDS = ("the key value cache of the attention layer is checked by the canary while "
               "the server decodes a batch of requests with a shared prefix").split()


def _say(message: str) -> None:
    print(f"[kv_canary demo] {message}", flush=True)


def build_workload(*, num_requests: int, vocab_size: int = _VOCAB_SIZE,
                   context_length: int = _CONTEXT_LENGTH, seed: int = 0) -> list[dict[str, object]]:
    """``/generate`` payloads, deterministic for a seed; every eighth request is one kind of:

    0-2: a shared prefix (one of three lengths) plus a private suffix (radix-cache sharing);
    3: a long prompt of 1500-3000 ids (chunked prefill); 4-5: a short text prompt (tokenizer
    path); 6: short random ids; 7: an exact repeat of the request seven before (full prefix hit).
    Greedy, ``ignore_eos``, 8-64 new tokens; every prompt plus its output fits
    ``context_length``. Ids are ordinary tokens (no special token).
    """
    from sglang.srt.kv_canary.tools.tiny_model import FIRST_ORDINARY_TOKEN_ID

    if num_requests < 1:
        raise ValueError(f"num_requests={num_requests!r} is invalid; allowed: an integer >= 1")
    rng = random.Random(seed)

    def ids(count: int) -> list[int]:
        return [rng.randrange(FIRST_ORDINARY_TOKEN_ID, vocab_size) for _ in range(count)]

    prefixes = [ids(length) for length in _SHARED_PREFIX_TOKENS]
    longest_prompt = context_length - _MAX_NEW_TOKENS - 1
    payloads: list[dict[str, object]] = []
    for index in range(num_requests):
        kind = index % 8
        prompt: dict[str, object]
        if kind <= 2:
            prompt = {"input_ids": prefixes[kind] + ids(rng.randint(8, 64))}
        elif kind == 3:
            low, high = (min(bound, longest_prompt) for bound in _LONG_PROMPT_TOKENS)
            prompt = {"input_ids": ids(rng.randint(low, high))}
        elif kind in (4, 5):
            prompt = {"text": " ".join(rng.choice(_TEXT_WORDS) for _ in range(rng.randint(4, 40)))}
        elif kind == 6:
            prompt = {"input_ids": ids(rng.randint(1, 32))}
        else:
            prompt = {key: value for key, value in payloads[index - 7].items()
                      if key in ("input_ids", "text")}
        payloads.append({
            **prompt,
            "rid": f"kv-canary-demo-{index}",
            "sampling_params": {"max_new_tokens": rng.randint(8, _MAX_NEW_TOKENS),
                                "temperature": 0.0, "ignore_eos": True},
        })
    return payloads


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def run_cpu_selfcheck(*, module: str = SELFCHECK_MODULE) -> int:
    """Run ``python -m module`` (Triton in interpreter mode); its exit code, or 2 if absent."""
    from sglang.srt.kv_canary.tools.environment import child_environment

    if importlib.util.find_spec(module) is None:
        _say(f"the CPU self-check ({module}) is not installed; nothing to run")
        return EXIT_NO_SELFCHECK
    _say(f"running python -m {module}")
    environment = child_environment(overrides={"TRITON_INTERPRET": "1"}, inherit_canary_env=True)
    return subprocess.run([sys.executable, "-m", module], env=environment, check=False).returncode


def report(summary: CanaryLogSummary, *, shown: int = 20) -> int:
    """Print what the canary saw; the demo's exit code for it."""
    print("\n== what the KV canary saw ==", flush=True)
    for line in summary.startup:
        print(f"start-up : {line.message}")
    if not summary.startup:
        print("start-up : NONE -- the server log has no 'KV canary enabled' line")
    latest = summary.latest_stats
    print(f"stats    : {len(summary.stats)} line(s)"
          + (f"; latest: {latest.message}" if latest else ""))
    print(f"violations: {len(summary.violations)}")
    for line in summary.violations[:shown]:
        print(f"  {line.message}")
    if len(summary.violations) > shown:
        print(f"  ... and {len(summary.violations) - shown} more (see the server log)")
    if summary.notices:
        print(f"other canary messages: {len(summary.notices)}")
        for notice in summary.notices[:shown]:
            print(f"  {notice.strip()}")
    print(f"health   : {len(summary.health_ok)} passed check(s)")
    if not summary.startup:
        print("RESULT: the canary did not start (is sglang-kv-canary installed?)", flush=True)
        return EXIT_VIOLATIONS
    if summary.violations:
        print(f"RESULT: {len(summary.violations)} violation(s)", flush=True)
        return EXIT_VIOLATIONS
    protected = _protected_tokens(latest)
    if not protected or not summary.health_ok:
        print(f"RESULT: no proof the canary checked anything (slots verified: {protected}, "
              f"health checks passed: {len(summary.health_ok)})", flush=True)
        return EXIT_VIOLATIONS
    print(f"RESULT: no violation ({protected} slot verifications, "
          f"{len(summary.health_ok)} health checks passed)", flush=True)
    return EXIT_CLEAN


def _protected_tokens(stats: CanaryLogLine | None) -> int:
    """Slot verifications the latest stats line reports (0 without one)."""
    if stats is None:
        return 0
    match = STATS_LINE_RE.search(stats.message)
    return int(match["protected"]) if match else 0


def _server_settings() -> tuple[dict[str, str], tuple[str, ...], str]:
    env = {"SGLANG_KV_CANARY_MODE": "log",
           "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": _STATS_EVERY_N_STEPS,
           "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": _STATS_EVERY_N_STEPS}
    args: tuple[str, ...] = ("--chunked-prefill-size", "1024")
    if importlib.util.find_spec(TOKEN_ORACLE_MODULE) is None:
        return env, args, "token oracle not installed: greedy sampling on dummy weights"
    env["SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"] = "1"
    return env, (*args, "--sampling-backend", "token_oracle"), "token oracle on"


def run_gpu_demo(*, num_requests: int, port: int | None, keep_server: bool,
                 ready_timeout_s: float) -> int:
    from sglang.srt.kv_canary.tools.server import (
        ServerLaunch, ServerRequestError, ServerStartError, start_server,
    )
    from sglang.srt.kv_canary.tools.tiny_model import make_tiny_model

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kv_canary_demo_"))
    model_dir = make_tiny_model(directory=workdir / "model", vocab_size=_VOCAB_SIZE,
                                max_position_embeddings=_CONTEXT_LENGTH)
    env, args, oracle_note = _server_settings()
    launch = ServerLaunch(model_dir=model_dir, log_path=workdir / "server.log", env=env,
                          args=args, port=port, inherit_canary_env=True,
                          ready_timeout_s=ready_timeout_s)
    _say(f"tiny model: {model_dir}")
    _say("launching SGLang with " + " ".join(f"{k}={v}" for k, v in env.items())
         + f" ({oracle_note})")
    server = start_server(launch)
    _say(f"server log: {launch.log_path} (process group {server.pgid})")
    keep = False
    try:
        try:
            waited = server.wait_ready()
            _say(f"server ready after {waited:.0f} s at {server.base_url}")
            _run_workload(server, num_requests=num_requests)
        except (ServerStartError, ServerRequestError) as error:
            _say(f"the server failed: {error}")
            return EXIT_SERVER_FAILED
        code = report(parse_canary_log(server.log_text()))
        keep = keep_server
        if keep:
            _say(f"server left running at {server.base_url}; stop it with: kill -- -{server.pgid}")
        return code
    finally:
        if not keep:
            server.stop()


def _run_workload(server: RunningServer, *, num_requests: int) -> None:
    workload = build_workload(num_requests=num_requests)
    started = time.monotonic()
    outputs = server.generate_many(workload, concurrency=8)
    flushed = server.flush_cache()
    replays = [{**payload, "rid": f"{payload['rid']}-after-flush"}
               for payload in workload[:_REPLAYED_AFTER_FLUSH]]
    replayed = server.generate_many(replays, concurrency=4)
    server.generate({"text": "one more step", "sampling_params": {"max_new_tokens": 4}})
    elapsed = time.monotonic() - started
    generated = sum(o["meta_info"]["completion_tokens"] for o in outputs + replayed)
    prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outputs + replayed)
    _say(f"workload: {len(workload)} requests, then {len(replayed)} again after "
         f"{'flushing' if flushed else 'FAILING to flush'} the radix cache: {prompt_tokens} "
         f"prompt tokens, {generated} generated, {elapsed:.1f} s")
    time.sleep(1.0)  # let the last log lines land


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang.srt.kv_canary.demo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48,
                        help="requests in the main workload (default 48)")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    parser.add_argument("--keep-server", action="store_true",
                        help="leave the server running at the end")
    parser.add_argument("--ready-timeout-s", type=float, default=600.0,
                        help="bound of the server start (default 600)")
    options = parser.parse_args(argv)
    if options.requests < 1:
        parser.error(f"--requests={options.requests} is invalid; allowed: an integer >= 1")
    if options.port is not None and not 1 <= options.port <= 65535:
        parser.error(f"--port={options.port} is invalid; allowed: 1..65535")
    if not options.ready_timeout_s > 0:
        parser.error(f"--ready-timeout-s={options.ready_timeout_s} is invalid; allowed: > 0")
    if not cuda_available():
        _say(NO_GPU_MESSAGE)
        return run_cpu_selfcheck()
    return run_gpu_demo(num_requests=options.requests, port=options.port,
                        keep_server=options.keep_server, ready_timeout_s=options.ready_timeout_s)


if __name__ == "__main__":
    raise SystemExit(main())
