"""The server workloads, their payloads, and the streamed client that times one round.

A round sends ``sequential_batches`` streamed ``POST /generate`` batches one after another, each
carrying ``num_requests`` prompts as ``input_ids`` (SGLang admits the requests of one batch
together). The radix cache is flushed before every round, so every round prefills its prompts.
With ``"stream": true`` and a per-request ``stream_interval`` of ``new_tokens`` SGLang 0.5.12
sends two chunks per request: one as soon as its first token exists, one when it finishes. Times
are taken on the client when a chunk's line arrives:

- a request's time to first token (TTFT): from just before the batch is written to the socket
  to the request's first chunk with a completion token;
- wall time: from the same start to ``data: [DONE]``;
- decode time: from the last request's first token to the last final chunk, during which every
  request runs its ``new_tokens - 1`` decode steps together.

Each workload reports one metric per round (:data:`METRICS`).
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sglang.srt.kv_canary.tools.tiny_model import FIRST_ORDINARY_TOKEN_ID

Metric = Literal["ttft_ms", "decode_tok_s", "prompt_tok_s"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricInfo:
    """How a metric is printed: its table label and decimals."""

    label: str
    digits: int


METRICS: dict[str, MetricInfo] = {
    "ttft_ms": MetricInfo(label="TTFT ms", digits=1),
    "decode_tok_s": MetricInfo(label="decode tok/s", digits=0),
    "prompt_tok_s": MetricInfo(label="prompt tok/s", digits=0),
}
_FLUSH_ATTEMPTS = 50
_BODY_CHARS = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One batch shape, sent once to warm up and then once per measured round.

    Attributes:
        name: the key on the command line, in tables and in the JSON.
        num_requests: prompts per batch, all in one ``/generate``.
        prompt_tokens: prompt length of every request.
        new_tokens: generated tokens of every request (``ignore_eos``), at least 2.
        metric: what a round reports (:data:`METRICS`).
        sequential_batches: batches per round, each sent when the previous one's stream ended
            (a mean time to first token over many batch-1 requests per round).
        note: what the workload stands for.
    """

    name: str
    num_requests: int
    prompt_tokens: int
    new_tokens: int
    metric: Metric
    sequential_batches: int = 1
    note: str = ""

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.prompt_tokens < 1 or self.new_tokens < 2:
            raise ValueError(f"workload {self.name!r}: num_requests >= 1, prompt_tokens >= 1 and "
                             "new_tokens >= 2 are required")
        if self.sequential_batches < 1:
            raise ValueError(f"workload {self.name!r}: sequential_batches="
                             f"{self.sequential_batches!r} is invalid; allowed: >= 1")
        if self.metric not in METRICS:
            raise ValueError(f"workload {self.name!r}: metric={self.metric!r} is invalid; "
                             "allowed: " + ", ".join(METRICS))

    @property
    def kv_tokens(self) -> int:
        """KV slots one batch holds at its end (all its requests together)."""
        return self.num_requests * (self.prompt_tokens + self.new_tokens)

    @property
    def context_tokens(self) -> int:
        """The longest sequence of one request (prompt + new tokens)."""
        return self.prompt_tokens + self.new_tokens

    def describe(self) -> str:
        batches = (f", {self.sequential_batches} batches one after another per round"
                   if self.sequential_batches > 1 else "")
        return (f"{self.num_requests} x {self.prompt_tokens}-token prompts, {self.new_tokens} "
                f"new tokens{batches}: {self.note}")

    def to_json(self) -> dict[str, object]:
        return {"num_requests": self.num_requests, "prompt_tokens": self.prompt_tokens,
                "new_tokens": self.new_tokens, "metric": self.metric,
                "sequential_batches": self.sequential_batches, "note": self.note}


WORKLOADS: dict[str, Workload] = {workload.name: workload for workload in (
    Workload(name="ttft1", num_requests=1, prompt_tokens=128, new_tokens=2, metric="ttft_ms",
             sequential_batches=16, note="time to first token at batch 1"),
    Workload(name="ttft64", num_requests=64, prompt_tokens=512, new_tokens=2, metric="ttft_ms",
             note="time to first token of 64 prompts arriving together"),
    Workload(name="decode1", num_requests=1, prompt_tokens=128, new_tokens=256,
             metric="decode_tok_s", note="decode throughput at batch 1"),
    Workload(name="decode64", num_requests=64, prompt_tokens=128, new_tokens=256,
             metric="decode_tok_s", note="decode throughput at batch 64"),
    Workload(name="prefill", num_requests=16, prompt_tokens=2048, new_tokens=2,
             metric="prompt_tok_s", note="prefill-heavy: prompt tokens per second"),
)}


def round_payload(*, workload: Workload, vocab_size: int, round_index: int,
                  batch_index: int) -> dict[str, object]:
    """The streamed ``/generate`` body of batch ``batch_index`` of round ``round_index`` (0: the
    warm-up). Deterministic per (workload, round, batch), so every configuration gets the same
    prompts; ordinary token ids only (no special token)."""
    rng = random.Random(f"{workload.name}/{round_index}/{batch_index}")
    ordinary = range(FIRST_ORDINARY_TOKEN_ID, vocab_size)
    return {
        "input_ids": [rng.choices(ordinary, k=workload.prompt_tokens)
                      for _ in range(workload.num_requests)],
        "stream": True,
        "sampling_params": {"max_new_tokens": workload.new_tokens, "temperature": 0.0,
                            "ignore_eos": True, "stream_interval": workload.new_tokens},
    }


class StreamError(RuntimeError):
    """A streamed round failed: an HTTP error, an error chunk, or a request never finished."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundTiming:
    """What one round measured, in seconds on the client's clock (see the module docstring).

    Attributes:
        wall_s: every batch's send to its ``[DONE]``, summed.
        ttft_s: per request, in order: send to the request's first token.
        decode_s: per batch, the last first token to the last final chunk, summed.
        new_tokens: generated tokens asked of every request.
        prompt_tokens: prompt tokens of every request, as the server counted them.
        output_tokens: generated tokens of every request, as the server counted them.
    """

    wall_s: float
    ttft_s: tuple[float, ...]
    decode_s: float
    new_tokens: int
    prompt_tokens: int
    output_tokens: int

    @classmethod
    def pooled(cls, timings: Sequence[RoundTiming]) -> RoundTiming:
        """The round of several batches sent one after another (times and counts summed,
        every request's TTFT kept).

        Raises:
            ValueError: no timings, or timings of different ``new_tokens``.
        """
        if not timings or len({timing.new_tokens for timing in timings}) != 1:
            raise ValueError("pooling needs one or more timings of one new_tokens")
        return cls(wall_s=sum(timing.wall_s for timing in timings),
                   ttft_s=tuple(ttft for timing in timings for ttft in timing.ttft_s),
                   decode_s=sum(timing.decode_s for timing in timings),
                   new_tokens=timings[0].new_tokens,
                   prompt_tokens=sum(timing.prompt_tokens for timing in timings),
                   output_tokens=sum(timing.output_tokens for timing in timings))

    def value(self, metric: Metric) -> float:
        """The round's figure of ``metric``: the mean TTFT in ms, the decode tokens per second
        of decode time (every request's ``new_tokens - 1``), or prompt tokens per second of
        wall time.

        Raises:
            ValueError: an unknown metric, or a throughput over no measured time.
        """
        if metric != "ttft_ms" and not min(self.decode_s, self.wall_s) > 0:
            raise ValueError(f"{metric} needs a measured time > 0; this round has decode_s="
                             f"{self.decode_s!r}, wall_s={self.wall_s!r}")
        if metric == "ttft_ms":
            return 1e3 * statistics.fmean(self.ttft_s)
        if metric == "decode_tok_s":
            return len(self.ttft_s) * (self.new_tokens - 1) / self.decode_s
        if metric == "prompt_tok_s":
            return self.prompt_tokens / self.wall_s
        raise ValueError(f"metric={metric!r} is invalid; allowed: " + ", ".join(METRICS))

    def to_json(self) -> dict[str, object]:
        return {"wall_s": self.wall_s, "ttft_s": list(self.ttft_s), "decode_s": self.decode_s,
                "new_tokens": self.new_tokens, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens}


class StreamCollector:
    """Reads the server-sent events of one streamed batch as they arrive: ``feed`` each line
    with its arrival time, then :meth:`timing`."""

    def __init__(self, *, num_requests: int, new_tokens: int, started: float) -> None:
        self._num_requests = num_requests
        self._new_tokens = new_tokens
        self._started = started
        self._first: dict[int, float] = {}
        self._final: dict[int, tuple[float, Mapping[str, object]]] = {}
        self._done_at: float | None = None

    def feed(self, *, line: bytes, at: float) -> bool:
        """Take one line received at ``at``; False once ``data: [DONE]`` was read.

        Raises:
            StreamError: an error chunk, or a chunk without a valid ``index``.
        """
        text = line.strip()
        if not text.startswith(b"data:"):
            return True  # blank separators, comments
        data = text[len(b"data:"):].strip()
        if data == b"[DONE]":
            self._done_at = at
            return False
        chunk = json.loads(data)
        if "error" in chunk:
            raise StreamError(f"the server streamed an error: {str(chunk['error'])[:_BODY_CHARS]}")
        index = chunk.get("index", 0)
        if not isinstance(index, int) or not 0 <= index < self._num_requests:
            raise StreamError(f"a chunk has index {index!r}; expected 0..{self._num_requests - 1}")
        meta = chunk.get("meta_info", {})
        if meta.get("completion_tokens", len(chunk.get("output_ids") or ())) >= 1:
            self._first.setdefault(index, at)
        if meta.get("finish_reason") is not None:
            self._final[index] = (at, meta)
        return True

    def timing(self) -> RoundTiming:
        """The batch's times.

        Raises:
            StreamError: no ``[DONE]``, or a request without a first token or a final chunk.
        """
        if self._done_at is None:
            raise StreamError("the stream ended before data: [DONE]")
        missing = [index for index in range(self._num_requests)
                   if index not in self._first or index not in self._final]
        if missing:
            raise StreamError(f"{len(missing)} of {self._num_requests} requests did not stream a "
                              f"first token and a final chunk (first: request {missing[0]})")
        finals = [self._final[index] for index in range(self._num_requests)]
        return RoundTiming(
            wall_s=self._done_at - self._started,
            ttft_s=tuple(self._first[index] - self._started
                         for index in range(self._num_requests)),
            decode_s=max(at for at, _ in finals) - max(self._first.values()),
            new_tokens=self._new_tokens,
            prompt_tokens=sum(int(meta.get("prompt_tokens", 0)) for _, meta in finals),
            output_tokens=sum(int(meta.get("completion_tokens", 0)) for _, meta in finals),
        )


def stream_generate(*, base_url: str, payload: Mapping[str, object], timeout_s: float,
                    clock: Callable[[], float]) -> RoundTiming:
    """Send one streamed ``/generate`` batch (``payload`` as :func:`round_payload`) and time it;
    ``timeout_s`` bounds the connection and every wait for the next line.

    Raises:
        StreamError: the server answered an error, could not be reached, or the stream was
            incomplete.
    """
    address = urllib.parse.urlsplit(base_url)
    prompts = payload["input_ids"]
    sampling = payload["sampling_params"]
    assert isinstance(prompts, list) and isinstance(sampling, Mapping)
    body = json.dumps(payload).encode()
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=timeout_s)
    try:
        started = clock()
        connection.request("POST", "/generate", body=body,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            text = response.read(_BODY_CHARS).decode(errors="replace")
            raise StreamError(f"POST /generate answered {response.status}: {text}")
        collector = StreamCollector(num_requests=len(prompts),
                                    new_tokens=int(sampling["max_new_tokens"]), started=started)
        while line := response.readline():
            if not collector.feed(line=line, at=clock()):
                break
        return collector.timing()
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as error:
        raise StreamError(f"POST /generate to {base_url} failed: {error!r}") from None
    finally:
        connection.close()


class BenchServer(Protocol):
    """What a round needs of ``sglang.srt.kv_canary.tools.server.RunningServer``."""

    base_url: str

    def flush_cache(self) -> bool: ...


def flush_radix_cache(server: BenchServer) -> None:
    """Empty the radix cache, retried while the scheduler refuses (it still holds a request).

    Raises:
        StreamError: still refused after a few seconds.
    """
    for _ in range(_FLUSH_ATTEMPTS):
        if server.flush_cache():
            return
        time.sleep(0.1)
    raise StreamError(f"/flush_cache was refused {_FLUSH_ATTEMPTS} times")


def run_round(server: BenchServer, *, workload: Workload, vocab_size: int, round_index: int,
              timeout_s: float, clock: Callable[[], float] = time.perf_counter) -> RoundTiming:
    """Flush the radix cache, then send and time round ``round_index`` of ``workload``.

    Raises:
        StreamError: the flush was refused or a batch failed.
    """
    flush_radix_cache(server)
    return RoundTiming.pooled([
        stream_generate(base_url=server.base_url,
                        payload=round_payload(workload=workload, vocab_size=vocab_size,
                                              round_index=round_index, batch_index=batch),
                        timeout_s=timeout_s, clock=clock)
        for batch in range(workload.sequential_batches)
    ])
