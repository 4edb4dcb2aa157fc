"""A stand-in for ``python -m sglang.launch_server`` that the server-tool tests launch.

Takes the launcher's ``--host/--port/--model-path`` (other flags ignored) and serves ``/health``,
``/generate`` (echo; a batch of ``input_ids`` with ``"stream": true`` is streamed as SGLang 0.5.12
streams it with a large ``stream_interval``: per request a first-token chunk, then per request a
final chunk, each with ``index`` and ``meta_info``, then ``data: [DONE]``, HTTP/1.1 chunked),
``/flush_cache`` and ``/abort_request``. It logs a scheduler-like pool line
(``max_total_num_tokens=... max_running_requests=... context_len=...``). Behaviour from the
environment:
FAKE_SERVER_MODE = serve (default) | exit (print a refusal, exit 3) | hang (never listen);
FAKE_SERVER_READY_DELAY_S (default 0): /health answers 503 until then;
FAKE_SERVER_CHILD_PID_FILE: start a child process in the same group and write its pid there;
FAKE_SERVER_IGNORE_SIGTERM=1: survive SIGTERM (the launcher must escalate to SIGKILL);
FAKE_SERVER_MAX_TOTAL_TOKENS (default 614400): the pool size it logs unless
``--max-total-tokens`` is given; for a model directory whose ``config.json`` has sliding-window
layers (``layer_types``) it also logs SGLang's hybrid pool line (``full_layer_tokens=`` the pool
size, ``swa_layer_tokens=`` 0.8 of it, SGLang's default ``--swa-full-tokens-ratio``);
FAKE_SERVER_AS_CONFIGURED=1: log what a real server of its configuration logs instead of the
fixed canary line: the plugin loader's line (``SGLANG_PLUGINS=none``: skipped, else loaded), the
end of a piecewise CUDA-graph capture unless ``--disable-piecewise-cuda-graph`` is given, and,
when ``SGLANG_KV_CANARY_MODE`` is set, the canary's start-up line in that mode and a stats line
after each streamed batch;
FAKE_SERVER_VIOLATIONS=1: a server whose canary runs logs a violation line after each streamed
batch;
FAKE_SERVER_DECODE_DELAY_S (default 0): the streamed answer waits this long between the
first-token chunks and the final chunks.
"""

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import time


def _layer_types(model_path: str | None) -> list[str]:
    """The ``layer_types`` of the model directory's ``config.json`` ([] without one)."""
    config = os.path.join(model_path or "", "config.json")
    if not os.path.isfile(config):
        return []
    with open(config, encoding="utf-8") as handle:
        return list(json.load(handle).get("layer_types") or [])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--model-path")
    parser.add_argument("--disable-piecewise-cuda-graph", action="store_true")
    parser.add_argument("--max-total-tokens", type=int)
    options, _ = parser.parse_known_args()
    as_configured = os.environ.get("FAKE_SERVER_AS_CONFIGURED") == "1"
    canary_mode = os.environ.get("SGLANG_KV_CANARY_MODE") if as_configured else "log"
    mode = os.environ.get("FAKE_SERVER_MODE", "serve")
    print(f"fake server: mode={mode} model={options.model_path}", flush=True)
    if os.environ.get("FAKE_SERVER_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child_pid_file = os.environ.get("FAKE_SERVER_CHILD_PID_FILE")
    if child_pid_file:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(child_pid_file, "w") as handle:
            handle.write(str(child.pid))
    if mode == "exit":
        print("refused: FAKE_SETTING='bad' is invalid; allowed: good", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "hang":
        while True:
            time.sleep(1)
    ready_at = time.monotonic() + float(os.environ.get("FAKE_SERVER_READY_DELAY_S", "0"))
    aborted: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # streamed answers use chunked transfer encoding

        def log_message(self, *args: object) -> None:
            # one write per line: handler threads log concurrently, and print() writes its
            # pieces separately (interleaved lines would hide a request from the tests' counts)
            sys.stdout.write(f"fake server request: {self.command} {self.path}\n")
            sys.stdout.flush()

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, payload: dict) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(body: object) -> None:
                data = b"data: " + (body if isinstance(body, bytes) else
                                    json.dumps(body).encode()) + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            prompts = payload["input_ids"]
            new_tokens = payload.get("sampling_params", {}).get("max_new_tokens", 1)
            for finished in (False, True):
                if finished:
                    time.sleep(float(os.environ.get("FAKE_SERVER_DECODE_DELAY_S", "0")))
                for index, prompt in enumerate(prompts):
                    tokens = new_tokens if finished else 1
                    event({"index": index, "output_ids": list(range(tokens)), "meta_info": {
                        "id": f"r{index}", "prompt_tokens": len(prompt),
                        "completion_tokens": tokens,
                        "finish_reason": {"type": "length", "length": tokens} if finished
                        else None}})
            if as_configured and canary_mode:
                batch_tokens = sum(len(prompt) + new_tokens for prompt in prompts)
                sys.stdout.write(f"[fake] KV canary stats: protected {batch_tokens} tokens, "
                                 "0 violations\n")
                if os.environ.get("FAKE_SERVER_VIOLATIONS") == "1":
                    sys.stdout.write("[fake] kv_canary violation: check=pre reason=fake\n")
                sys.stdout.flush()
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200 if time.monotonic() >= ready_at else 503, {})
            elif self.path == "/aborted":
                self._answer(200, aborted)
            else:
                self._answer(404, {"error": self.path})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            payload = json.loads(self.rfile.read(length) or b"null")
            if self.path == "/generate":
                if payload.get("fail"):
                    self._answer(400, {"error": "asked to fail"})
                    return
                if payload.get("stream") and isinstance(payload.get("input_ids"), list):
                    self._stream(payload)
                    return
                new_tokens = payload.get("sampling_params", {}).get("max_new_tokens", 1)
                texts = payload.get("text")
                if isinstance(texts, list):
                    self._answer(200, [{"text": t.upper(), "meta_info": {
                        "completion_tokens": new_tokens}} for t in texts])
                else:
                    self._answer(200, {"text": str(texts).upper(), "rid": payload.get("rid"),
                                       "meta_info": {"completion_tokens": new_tokens}})
            elif self.path == "/flush_cache":
                self._answer(200, {})
            elif self.path == "/abort_request":
                aborted.append(payload["rid"])
                self._answer(200, {})
            else:
                self._answer(404, {"error": self.path})

    if as_configured:
        plugin = ("Skipping plugin kv_canary (not in SGLANG_PLUGINS)"
                  if os.environ.get("SGLANG_PLUGINS") == "none"
                  else "Loaded plugin kv_canary from group sglang.srt.plugins")
        print(f"[fake] {plugin}", flush=True)
        if not options.disable_piecewise_cuda_graph:
            print("[fake] Capture piecewise CUDA graph end", flush=True)
    if canary_mode:
        print(f"KV canary enabled: mode={canary_mode} (fake)", flush=True)
    pool_tokens = options.max_total_tokens or int(
        os.environ.get("FAKE_SERVER_MAX_TOTAL_TOKENS", "614400"))
    if "sliding_attention" in _layer_types(options.model_path):
        print("Use sliding window memory pool. "
              f"full_layer_tokens={pool_tokens}, swa_layer_tokens={int(pool_tokens * 0.8)}",
              flush=True)
    print(f"max_total_num_tokens={pool_tokens}, "
          "chunked_prefill_size=8192, max_running_requests=2048, context_len=40960", flush=True)
    http.server.ThreadingHTTPServer((options.host, options.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
