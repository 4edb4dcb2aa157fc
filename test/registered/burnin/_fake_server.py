"""A stand-in of SGLang 0.5.12's HTTP server for the burn-in tests (``http.server`` in a thread).

Serves what the burn-in calls, the way SGLang answers it:

* ``POST /generate``: ``input_ids`` (ids below :data:`VOCAB`) or ``text``; 400 when the prompt
  plus ``max_new_tokens`` exceed ``max_req_input_len + 1``; ``n > 1``: a list of ``n`` outputs;
  a generation takes ``token_s`` per token and stops early, with ``finish_reason`` ``abort``,
  when its rid is aborted; ``"stream": true``: one ``data:`` event per token, then
  ``data: [DONE]`` (a client that leaves stops it);
* ``POST /abort_request``: aborts every running request whose rid starts with the given one;
* ``POST /flush_cache``: 200 when nothing runs, else 400;
* ``GET /server_info`` and ``/get_server_info`` (unless ``server_info=False``),
  ``/health_generate`` (``health_status``), ``/health``.

It writes a server log (``log_path``; to stdout when run as ``python -m _fake_server``): the
canary's start-up line (``canary_on``), a stats line and a ``health ok`` line every 10 answers,
a violation row after ``violation_after`` answers (once), and SGLang's retraction line when more
than 8 requests run at once. ``fail_generate_at=k``: the k-th ``/generate`` answers 500.
"""

from __future__ import annotations

import argparse
import http.server
import json
import pathlib
import sys
import threading
import time
from dataclasses import dataclass, field

VOCAB = 4096
VIOLATION_LINE = (
    "kv_canary violation: check=post_verify reasons=verify_position+verify_chain_hash "
    "req_pool_idx=3 slot=77 position=12 stored_token=40 expected_token=-1 "
    "stored_chain=0x00000000000000aa expected_chain=0x00000000000000bb step=42"
)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # a retraction burst connects all at once (uvicorn's is 2048)


@dataclass
class Seen:
    """What the fake saw (read by the tests)."""

    generates: int = 0
    streams: int = 0
    streams_left: int = 0  # streamed requests whose client went away before the end
    parallel: int = 0
    texts: int = 0
    aborts: list[str] = field(default_factory=list)
    aborted: int = 0
    flushes: int = 0
    health: int = 0
    server_info: int = 0
    answered: int = 0


class FakeSglang:
    """The stand-in server; :meth:`start` it, :meth:`stop` it (or use ``with``)."""

    def __init__(self, *, log_path: pathlib.Path | None = None, page_size: int = 4,
                 chunk: int = 64, pool: int = 4096, max_input: int = 1023,
                 server_info: bool = True, canary_on: bool = True,
                 fail_generate_at: int | None = None, violation_after: int | None = None,
                 health_status: int = 200, token_s: float = 0.0005,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.log_path = log_path
        self.page_size, self.chunk, self.pool, self.max_input = page_size, chunk, pool, max_input
        self.server_info_on = server_info
        self.canary_on = canary_on
        self.fail_generate_at = fail_generate_at
        self.violation_after = violation_after
        self.health_status = health_status
        self.token_s = token_s
        self.seen = Seen()
        self._lock = threading.Lock()
        self._running: dict[str, threading.Event] = {}
        self._log_lock = threading.Lock()
        self._httpd = _Server((host, port), self._handler_class())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeSglang:
        if self.canary_on:
            self.log("[fake] KV canary enabled: mode=log real_data=none sweep_interval=0 (fake)")
        self.log("[fake] The server is fired up and ready to roll!")
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeSglang:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        self.start()
        assert self._thread is not None
        self._thread.join()

    # ------------------------------------------------------------------ log
    def log(self, line: str) -> None:
        with self._log_lock:
            if self.log_path is None:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            else:
                with self.log_path.open("a", encoding="utf-8") as log:
                    log.write(line + "\n")

    def _answered(self) -> None:
        with self._lock:
            self.seen.answered += 1
            answered = self.seen.answered
        if self.canary_on and answered % 10 == 0:
            self.log(f"[fake] KV canary stats: protected {answered * 100} tokens (slots "
                     f"verified), {answered * 10} slots written, 0 sweeps (0 slots swept), "
                     f"0 violations, {answered * 3} steps")
            self.log(f"[fake] kv_canary health ok: steps 0..{answered * 3}: {answered * 3} "
                     "launches, kernel runs pre_verify 1, post_verify 1, write 1, sweep 0")
        if self.violation_after is not None and answered == self.violation_after:
            self.log(f"[fake] {VIOLATION_LINE}")

    # ------------------------------------------------------------------ requests
    def info(self) -> dict[str, object]:
        return {"page_size": self.page_size, "chunked_prefill_size": self.chunk,
                "max_total_num_tokens": self.pool, "max_req_input_len": self.max_input,
                "max_running_requests": 64, "model_path": "/fake/model",
                "version": "0.5.12.post1", "context_length": None}

    def _begin(self, rid: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._running[rid] = event
            running = len(self._running)
        if running > 8:
            self.log(f"[fake] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
                     f"#new_tokens_gained: 100")
        return event

    def _end(self, rid: str) -> None:
        with self._lock:
            self._running.pop(rid, None)

    def abort(self, rid: str) -> None:
        with self._lock:
            self.seen.aborts.append(rid)
            for running, event in self._running.items():
                if running.startswith(rid):
                    event.set()

    def check_generate(self, payload: dict) -> tuple[int, object] | None:
        """An error answer for a payload SGLang would refuse, or None."""
        with self._lock:
            self.seen.generates += 1
            number = self.seen.generates
        if self.fail_generate_at is not None and number == self.fail_generate_at:
            return 500, {"error": {"message": "fake internal error"}}
        sampling = payload.get("sampling_params") or {}
        new_tokens = sampling.get("max_new_tokens")
        ids = payload.get("input_ids")
        if ids is not None:
            if not ids or any(not isinstance(i, int) or not 0 <= i < VOCAB for i in ids):
                return 400, {"error": {"message": f"input_ids out of the vocab ({VOCAB})"}}
            prompt = len(ids)
        else:
            prompt = len(str(payload.get("text")).split())
        if not isinstance(new_tokens, int) or prompt + new_tokens > self.max_input + 1:
            return 400, {"error": {"message": f"Requested token count exceeds the context "
                                              f"({prompt} + {new_tokens})"}}
        if sampling.get("ignore_eos") is not True:
            return 400, {"error": {"message": "the burn-in always sets ignore_eos"}}
        return None

    def output(self, *, rid: str, prompt: int, generated: int, new_tokens: int,
               aborted: bool) -> dict[str, object]:
        finish = ({"type": "abort", "message": "Abort"} if aborted
                  else {"type": "length", "length": new_tokens})
        return {"text": "x" * generated, "output_ids": list(range(generated)), "meta_info": {
            "id": rid, "prompt_tokens": prompt, "completion_tokens": generated,
            "cached_tokens": prompt // 2, "finish_reason": finish}}

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: object) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path in ("/server_info", "/get_server_info") and fake.server_info_on:
                    with fake._lock:
                        fake.seen.server_info += 1
                    self._answer(200, fake.info())
                elif self.path == "/health_generate":
                    with fake._lock:
                        fake.seen.health += 1
                    self._answer(fake.health_status, b"")
                elif self.path == "/health":
                    self._answer(200, b"")
                else:
                    self._answer(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(length) or b"null")
                try:
                    if self.path == "/generate":
                        self._generate(payload)
                    elif self.path == "/abort_request":
                        fake.abort(payload["rid"])
                        self._answer(200, b"")
                    elif self.path == "/flush_cache":
                        with fake._lock:
                            fake.seen.flushes += 1
                            busy = bool(fake._running)
                        self._answer(400 if busy else 200, b"Cache not flushed" if busy
                                     else b"Cache flushed.")
                    else:
                        self._answer(404, {"detail": "Not Found"})
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away

            def _generate(self, payload: dict) -> None:
                refusal = fake.check_generate(payload)
                if refusal is not None:
                    self._answer(*refusal)
                    return
                rid = payload["rid"]
                sampling = payload["sampling_params"]
                new_tokens, n = sampling["max_new_tokens"], sampling.get("n", 1)
                ids = payload.get("input_ids")
                prompt = len(ids) if ids is not None else len(payload["text"].split())
                with fake._lock:
                    fake.seen.parallel += n > 1
                    fake.seen.texts += ids is None
                if payload.get("stream"):
                    self._stream(rid, prompt, new_tokens)
                    return
                event = fake._begin(rid)
                try:
                    aborted = event.wait(fake.token_s * new_tokens)
                finally:
                    fake._end(rid)
                generated = new_tokens // 2 if aborted else new_tokens
                with fake._lock:
                    fake.seen.aborted += aborted
                outputs = [fake.output(rid=f"{rid}_{i}" if n > 1 else rid, prompt=prompt,
                                       generated=generated, new_tokens=new_tokens,
                                       aborted=aborted) for i in range(n)]
                fake._answered()
                self._answer(200, outputs if n > 1 else outputs[0])

            def _stream(self, rid: str, prompt: int, new_tokens: int) -> None:
                with fake._lock:
                    fake.seen.streams += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def event(data: bytes) -> None:
                    data = b"data: " + data + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

                fake._begin(rid)
                try:
                    for generated in range(1, new_tokens + 1):
                        time.sleep(fake.token_s * 4)
                        event(json.dumps(fake.output(rid=rid, prompt=prompt,
                                                     generated=generated,
                                                     new_tokens=new_tokens,
                                                     aborted=False)).encode())
                    event(b"[DONE]")
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    with fake._lock:
                        fake.seen.streams_left += 1
                    raise
                finally:
                    fake._end(rid)
                fake._answered()

        return Handler


def main() -> None:
    """``python -m _fake_server --host H --port P --model-path M`` (what ServerLaunch runs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path")
    parser.add_argument("--page-size", type=int, default=4)
    options, _unknown = parser.parse_known_args()
    print(f"[fake] launched with {' '.join(sys.argv[1:])}", flush=True)
    FakeSglang(host=options.host, port=options.port,
               page_size=options.page_size).serve_forever()


if __name__ == "__main__":
    main()
