"""The workloads of ``bench_server_overhead.py`` and how one round of a workload is sent and timed.

A round is one streamed ``POST /generate`` carrying a batch of ``input_ids`` (SGLang admits the
requests of a batch together: they arrive at the scheduler at once). ``"stream": true`` with a
per-request ``stream_interval`` of ``new_tokens`` makes SGLang 0.5.12 send exactly two chunks per
request: one as soon as its first token exists and one when it finishes (``stream_interval > 1``
streams at output lengths ``1, interval + 1, ...``; a finished request always streams). Each chunk
carries ``index`` (the request's place in the batch) and ``meta_info``. Times are taken on the
client when a chunk's line arrives:

- TTFT of a request: from just before the request is written to the socket to its first chunk
  with at least one completion token;
- wall time: from the same start to ``data: [DONE]``;
- decode time: from the last request's first token to the last request's final chunk; every
  request then runs ``new_tokens - 1`` decode steps together, so decode time / (new_tokens - 1)
  is the time of one decode step of the whole batch, without the prefill.
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

ThroughputKind = Literal["output", "prompt"]
_FLUSH_ATTEMPTS = 20
_BODY_CHARS = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One batch shape, sent once to warm up and then once per measured round.

    Attributes:
        name: the key used on the command line, in tables and in the JSON.
        num_requests: requests per round, all in one ``/generate`` batch.
        prompt_tokens: prompt length of every request.
        new_tokens: generated tokens of every request (``ignore_eos``); at least 2, so that at
            least one decode step follows the first token.
        throughput: which tokens per second the workload reports (``output`` or ``prompt``).
        cached_prefix_tokens: the first tokens of every prompt are the same in every round of
            this workload (different per request); the radix cache is flushed only before the
            warm-up round, which prefills them, and the measured rounds reuse them. 0: every
            round's prompts are new and the cache is flushed before every round.
        step_target: whether the "ms added per decode step" target applies to this workload.
        sequential_batches: batches sent one after another in a round, each its own
            ``/generate`` with fresh prompts (the next one sent when the previous one's stream
            ended); the round pools them (:meth:`RoundTiming.pooled`). Many small batches give
            one server's time to first token a mean over many requests, where a single batch-1
            request per round leaves it to a handful of samples.
        note: what the workload stands for, for the printed table.
    """

    name: str
    num_requests: int
    prompt_tokens: int
    new_tokens: int
    throughput: ThroughputKind
    cached_prefix_tokens: int = 0
    step_target: bool = False
    sequential_batches: int = 1
    note: str = ""

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.prompt_tokens < 1 or self.new_tokens < 2:
            raise ValueError(f"workload {self.name!r}: num_requests >= 1, prompt_tokens >= 1 and "
                             "new_tokens >= 2 are required")
        if self.sequential_batches < 1:
            raise ValueError(f"workload {self.name!r}: sequential_batches="
                             f"{self.sequential_batches} is invalid; allowed: an integer >= 1")
        if not 0 <= self.cached_prefix_tokens < self.prompt_tokens:
            raise ValueError(f"workload {self.name!r}: cached_prefix_tokens="
                             f"{self.cached_prefix_tokens} is invalid; allowed: 0 <= n < "
                             f"prompt_tokens ({self.prompt_tokens})")

    @property
    def kv_tokens(self) -> int:
        """KV slots the batch holds at its end, all requests running together."""
        return self.num_requests * (self.prompt_tokens + self.new_tokens)

    @property
    def context_tokens(self) -> int:
        """The longest sequence of one request (prompt + new tokens)."""
        return self.prompt_tokens + self.new_tokens

    def describe(self) -> str:
        cached = (f", first {self.cached_prefix_tokens} prompt tokens reused from the radix "
                  "cache in measured rounds" if self.cached_prefix_tokens else "")
        batches = (f", {self.sequential_batches} such batches one after another per round"
                   if self.sequential_batches > 1 else "")
        note = f" ({self.note})" if self.note else ""
        return (f"{self.num_requests} x {self.prompt_tokens}-token prompts, {self.new_tokens} new "
                f"tokens{cached}{batches}; throughput = {self.throughput} tok/s{note}")


WORKLOADS: tuple[Workload, ...] = (
    Workload(name="decode64", num_requests=64, prompt_tokens=128, new_tokens=256,
             throughput="output", note="decode-heavy batch"),
    Workload(name="bs1", num_requests=1, prompt_tokens=128, new_tokens=512,
             throughput="output", note="batch-1 decode"),
    Workload(name="ttft1", num_requests=1, prompt_tokens=128, new_tokens=2,
             throughput="output", sequential_batches=32,
             note="batch-1 time to first token: a mean over 32 requests per round"),
    Workload(name="prefill32", num_requests=32, prompt_tokens=2048, new_tokens=8,
             throughput="prompt", note="prefill-heavy batch"),
    Workload(name="prefill64x512", num_requests=64, prompt_tokens=512, new_tokens=512,
             throughput="output", note="concurrent prefill: 64 prompts arrive together"),
    Workload(name="decode64_8k", num_requests=64, prompt_tokens=8192, new_tokens=256,
             throughput="output", cached_prefix_tokens=8128, step_target=True,
             note="decode over 8k-token histories"),
    Workload(name="bs1_32k", num_requests=1, prompt_tokens=32768, new_tokens=256,
             throughput="output", cached_prefix_tokens=32704,
             note="batch-1 decode over a 32k-token history"),
    Workload(name="admit64_8k", num_requests=64, prompt_tokens=8192, new_tokens=2,
             throughput="output", cached_prefix_tokens=8128,
             note="admission: TTFT of 64 requests with 8k cached tokens arriving together"),
)
WORKLOADS_BY_NAME: dict[str, Workload] = {workload.name: workload for workload in WORKLOADS}


def round_payload(*, workload: Workload, vocab_size: int, round_index: int,
                  batch_index: int = 0) -> dict[str, object]:
    """The streamed ``/generate`` batch ``batch_index`` of one round (round 0 is the warm-up;
    ``batch_index`` below ``workload.sequential_batches``).

    Deterministic for (workload, round, batch), so every configuration gets the same prompts.
    Token ids are ordinary (no special token). The first ``cached_prefix_tokens`` of request
    ``i`` depend on (workload, i) only; the rest depends on the round and the batch too, so no
    two batches share more than that prefix.
    """
    seed = f"{workload.name}/{round_index}"
    rng = random.Random(seed if batch_index == 0 else f"{seed}/{batch_index}")
    ordinary = range(FIRST_ORDINARY_TOKEN_ID, vocab_size)
    fresh_tokens = workload.prompt_tokens - workload.cached_prefix_tokens
    prompts = []
    for request in range(workload.num_requests):
        prefix = random.Random(f"{workload.name}/prefix/{request}").choices(
            ordinary, k=workload.cached_prefix_tokens)
        prompts.append(prefix + rng.choices(ordinary, k=fresh_tokens))
    return {
        "input_ids": prompts,
        "stream": True,
        "sampling_params": {"max_new_tokens": workload.new_tokens, "temperature": 0.0,
                            "ignore_eos": True, "stream_interval": workload.new_tokens},
    }


# ----------------------------------------------------------------------------- one round's times

class StreamError(RuntimeError):
    """A streamed round failed: an HTTP error, an error chunk, or a request never finished."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundTiming:
    """What one round measured, in seconds on the client's clock (see the module docstring).

    Attributes:
        wall_s: send to the end of the stream.
        ttft_s: per request, in batch order: send to the request's first token.
        decode_s: the last first token to the last final chunk.
        new_tokens: generated tokens asked of every request.
        prompt_tokens: prompt tokens of all requests, as the server counted them.
        output_tokens: generated tokens of all requests, as the server counted them.
    """

    wall_s: float
    ttft_s: tuple[float, ...]
    decode_s: float
    new_tokens: int
    prompt_tokens: int
    output_tokens: int

    @property
    def mean_ttft_s(self) -> float:
        return statistics.fmean(self.ttft_s)

    @classmethod
    def pooled(cls, timings: Sequence[RoundTiming]) -> RoundTiming:
        """One round of batches sent one after another: wall times and token counts summed,
        every request's TTFT kept, the decode time their mean (so :attr:`step_ms` is the mean
        decode step).

        Raises:
            ValueError: no timings, or timings with different ``new_tokens``.
        """
        if not timings or len({timing.new_tokens for timing in timings}) != 1:
            raise ValueError("pooling needs one or more timings with the same new_tokens")
        return cls(
            wall_s=sum(timing.wall_s for timing in timings),
            ttft_s=tuple(ttft for timing in timings for ttft in timing.ttft_s),
            decode_s=statistics.fmean(timing.decode_s for timing in timings),
            new_tokens=timings[0].new_tokens,
            prompt_tokens=sum(timing.prompt_tokens for timing in timings),
            output_tokens=sum(timing.output_tokens for timing in timings),
        )

    def tok_s(self, kind: ThroughputKind) -> float:
        """Output or prompt tokens of the round per second of wall time."""
        tokens = self.output_tokens if kind == "output" else self.prompt_tokens
        return tokens / self.wall_s

    @property
    def step_ms(self) -> float:
        """One decode step of the batch: decode time / (new_tokens - 1), in ms."""
        return 1e3 * self.decode_s / (self.new_tokens - 1)

    def to_json(self) -> dict[str, object]:
        return {"wall_s": self.wall_s, "ttft_s": list(self.ttft_s), "decode_s": self.decode_s,
                "new_tokens": self.new_tokens, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "mean_ttft_s": self.mean_ttft_s,
                "output_tok_s": self.tok_s("output"), "prompt_tok_s": self.tok_s("prompt"),
                "step_ms": self.step_ms}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RoundTiming:
        """The round :meth:`to_json` wrote (its derived figures are computed again)."""
        return cls(wall_s=float(data["wall_s"]), ttft_s=tuple(map(float, data["ttft_s"])),
                   decode_s=float(data["decode_s"]), new_tokens=int(data["new_tokens"]),
                   prompt_tokens=int(data["prompt_tokens"]),
                   output_tokens=int(data["output_tokens"]))


class StreamCollector:
    """Reads the server-sent events of one streamed batch, line by line, as they arrive.

    ``feed`` every line with its arrival time; then ``timing`` gives the round's times.
    """

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
            StreamError: the line is an error chunk, or a chunk without a valid ``index``.
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
        generated = meta.get("completion_tokens", len(chunk.get("output_ids") or ()))
        if generated >= 1:
            self._first.setdefault(index, at)
        if meta.get("finish_reason") is not None:
            self._final[index] = (at, meta)
        return True

    def timing(self) -> RoundTiming:
        """The round's times.

        Raises:
            StreamError: the stream ended before ``[DONE]``, or a request has no first token or
                no final chunk.
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
            ttft_s=tuple(self._first[index] - self._started for index in range(self._num_requests)),
            decode_s=max(at for at, _ in finals) - max(self._first.values()),
            new_tokens=self._new_tokens,
            prompt_tokens=sum(int(meta.get("prompt_tokens", 0)) for _, meta in finals),
            output_tokens=sum(int(meta.get("completion_tokens", 0)) for _, meta in finals),
        )


def stream_generate(*, base_url: str, payload: Mapping[str, object], timeout_s: float,
                    clock: Callable[[], float]) -> RoundTiming:
    """Send one streamed ``/generate`` batch and time it (``payload`` as :func:`round_payload`).

    ``timeout_s`` bounds the connection and every wait for the next line.

    Raises:
        StreamError: the server answered an error, could not be reached, or the stream was
            incomplete.
        ValueError: ``payload`` has no list of ``input_ids`` or no ``sampling_params``.
    """
    address = urllib.parse.urlsplit(base_url)
    input_ids, sampling = payload["input_ids"], payload["sampling_params"]
    if not isinstance(input_ids, list) or not isinstance(sampling, Mapping):
        raise ValueError("payload needs input_ids (a list of prompts) and sampling_params")
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
        collector = StreamCollector(num_requests=len(input_ids),
                                    new_tokens=int(sampling["max_new_tokens"]), started=started)
        while line := response.readline():
            if not collector.feed(line=line, at=clock()):
                break
        return collector.timing()
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as error:
        raise StreamError(f"POST /generate to {base_url} failed: {error!r}") from None
    finally:
        connection.close()


# ----------------------------------------------------------------------------- one round

class BenchServer(Protocol):
    """What a round needs of ``tools.server.RunningServer``."""

    base_url: str

    def flush_cache(self) -> bool: ...


def flush_radix_cache(server: BenchServer) -> None:
    """Empty the radix cache (retried: the scheduler refuses while it still holds a request).

    Raises:
        RuntimeError: still refused after ``_FLUSH_ATTEMPTS`` tries.
    """
    for _ in range(_FLUSH_ATTEMPTS):
        if server.flush_cache():
            return
        time.sleep(0.1)
    raise RuntimeError(f"/flush_cache was refused {_FLUSH_ATTEMPTS} times")


def run_round(server: BenchServer, *, workload: Workload, vocab_size: int, round_index: int,
              timeout_s: float, clock: Callable[[], float]) -> RoundTiming:
    """Flush the radix cache (before every round, or only before the warm-up round 0 of a
    workload with a cached prefix), then send and time round ``round_index``: its batches one
    after another, pooled (:meth:`RoundTiming.pooled`) when there are several.

    Raises:
        RuntimeError: the flush was refused, or :class:`StreamError`.
    """
    if round_index == 0 or not workload.cached_prefix_tokens:
        flush_radix_cache(server)
    timings = [
        stream_generate(
            base_url=server.base_url,
            payload=round_payload(workload=workload, vocab_size=vocab_size,
                                  round_index=round_index, batch_index=batch_index),
            timeout_s=timeout_s, clock=clock)
        for batch_index in range(workload.sequential_batches)
    ]
    return timings[0] if len(timings) == 1 else RoundTiming.pooled(timings)


class RoundRunner(Protocol):
    """Runs one round as :func:`run_round` does (a stand-in in tests)."""

    def __call__(self, server: BenchServer, *, workload: Workload, vocab_size: int,
                 round_index: int, timeout_s: float,
                 clock: Callable[[], float]) -> RoundTiming: ...
