"""The burn-in's request mix, as data: a seeded, endless sequence of :class:`Action`.

Nothing here talks to a server. :func:`derive_shape` turns the arguments and what the server
says about itself into a :class:`WorkloadShape`; :func:`actions` yields the same actions for the
same shape, seed and rid prefix. The actions come in rounds; each round holds every ingredient,
shuffled by the seed:

* ``page_prefix`` (x6): a prompt that shares ``k * page_size + d`` tokens (``d`` in -1, 0, +1)
  with other prompts of one of four base sequences, then a private suffix whose length is 0,
  1, a page -1, a page, a page +1 or random; generations of 1, a page +-1 or random tokens.
  Every shared length sits at a page boundary or one off it (the radix cache rounds matches to
  whole pages).
* ``repeat`` (x2): an exact earlier prompt again (a full prefix hit).
* ``long_chunked``: a prompt longer than the server's chunked-prefill size (up to three chunks,
  sometimes exactly a chunk boundary +-1, sometimes behind a shared prefix).
* ``parallel_n`` (x2): ``n`` in 2, 3, 4, 8 siblings of one prompt, sampled at temperature 0.8.
* ``retraction_burst``: :attr:`WorkloadShape.burst_requests` long generations at once, sized to
  outgrow the KV pool so that the scheduler retracts.
* ``abort``: a long generation, then ``/abort_request`` for its rid after 0.02-1.5 s (a third of
  them behind a long prompt, aborted during its prefill).
* ``disconnect``: a long generation whose client goes away: a streamed one read for 0.05-1 s,
  or a plain one given up after that long.
* ``flush``: ``/flush_cache`` while requests run (SGLang refuses it then); every fourth round,
  from the second on, starts with a drained flush instead (nothing in flight: it flushes, and
  later prompts of the same bases are computed again).
* ``mixed`` (x3): short random prompts (1 token to 512), text prompts (the tokenizer path),
  generations from 1 token to the maximum.

Rids are ``<rid_prefix>-<index:09d>`` (burst members ``...-<j:04d>``): no rid is a prefix of
another, as ``/abort_request`` matches rids by prefix. Every prompt plus its generation fits
``max_prompt_tokens`` plus ``max_new_tokens``; greedy unless said otherwise; ``ignore_eos``
everywhere, so each answer must carry exactly ``max_new_tokens`` tokens.
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

BASE_SEQUENCES = 4
ROUND: tuple[tuple[str, int], ...] = (
    ("page_prefix", 6), ("repeat", 2), ("long_chunked", 1), ("parallel_n", 2),
    ("retraction_burst", 1), ("abort", 1), ("disconnect", 1), ("flush", 1), ("mixed", 3),
)
DRAINED_FLUSH_EVERY_ROUNDS = 4  # rounds 1, 5, 9, ... start with a drained flush
PARALLEL_N = (2, 3, 4, 8)
SAMPLING_TEMPERATURE = 0.8
DEFAULT_MAX_PROMPT_TOKENS = 2048
MAX_DERIVED_PROMPT_TOKENS = 32768
DEFAULT_BURST_REQUESTS = 32
_BURST_LIMITS = (8, 256)
_BURST_OVERCOMMIT = 1.5  # a burst asks for this many times the KV pool
_MIN_PROMPT_TOKENS = 8
_TEXT_WORDS = (
    "the key value cache of every attention layer holds one slot per token while the server "
    "decodes a batch of requests that share a prefix page by page and the radix tree keeps "
    "what was computed for the next request"
).split()


class Ingredient(enum.Enum):
    """One kind of action of the mix (see the module docstring)."""

    PAGE_PREFIX = "page_prefix"
    REPEAT = "repeat"
    LONG_CHUNKED = "long_chunked"
    PARALLEL_N = "parallel_n"
    RETRACTION_BURST = "retraction_burst"
    ABORT = "abort"
    DISCONNECT = "disconnect"
    FLUSH = "flush"
    MIXED = "mixed"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadShape:
    """The sizes the mix is cut to.

    Attributes:
        page_size: prefixes are cut at multiples of it, +-1.
        token_low, token_high: prompt ids are drawn from ``[token_low, token_high)``.
        max_prompt_tokens: the longest prompt (id prompts; text prompts stay far below).
        max_new_tokens: the longest generation.
        chunk_tokens: the server's chunked-prefill size (None: unknown or chunking off; long
            prompts are then half to all of ``max_prompt_tokens``).
        burst_requests: requests per retraction burst.
    """

    page_size: int
    token_low: int
    token_high: int
    max_prompt_tokens: int
    max_new_tokens: int
    chunk_tokens: int | None
    burst_requests: int

    def __post_init__(self) -> None:
        checks = {
            "page_size": self.page_size >= 1,
            "token_low": 0 <= self.token_low,
            "token_high": self.token_high >= self.token_low + 2,
            "max_prompt_tokens": self.max_prompt_tokens >= max(
                _MIN_PROMPT_TOKENS, 2 * self.page_size + 2),
            "max_new_tokens": self.max_new_tokens >= 1,
            "chunk_tokens": self.chunk_tokens is None or self.chunk_tokens >= 1,
            "burst_requests": self.burst_requests >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid for {self!r}")

    @property
    def chunked_prompts(self) -> bool:
        """Whether long prompts exceed the chunked-prefill size."""
        return self.chunk_tokens is not None and self.chunk_tokens < self.max_prompt_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One ``/generate`` request: ``input_ids`` or ``text``, greedy unless ``temperature``;
    ``shared_prefix`` is not sent (it says how many leading ids come from a base sequence)."""

    rid: str
    input_ids: tuple[int, ...] | None = None
    text: str | None = None
    max_new_tokens: int
    n: int = 1
    temperature: float = 0.0
    shared_prefix: int = 0  # leading ids taken from a base sequence (shared with other prompts)

    def __post_init__(self) -> None:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError(f"request {self.rid}: give exactly one of input_ids and text")

    def payload(self, *, stream: bool = False) -> dict[str, object]:
        """The JSON body of SGLang's native ``/generate``."""
        sampling: dict[str, object] = {"max_new_tokens": self.max_new_tokens,
                                       "temperature": self.temperature, "ignore_eos": True}
        if self.n > 1:
            sampling["n"] = self.n
        body: dict[str, object] = {"rid": self.rid, "sampling_params": sampling}
        if self.input_ids is not None:
            body["input_ids"] = list(self.input_ids)
        else:
            body["text"] = self.text
        if stream:
            body["stream"] = True
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One step of the mix.

    Attributes:
        index: position in the sequence (0, 1, ...).
        ingredient: what kind of step.
        requests: the requests it sends (one; a burst's many; none for a flush).
        delay_s: ``abort``: seconds before ``/abort_request``; ``disconnect``: seconds the
            client stays before it goes away.
        streaming: ``disconnect``: a streamed request (else a plain one).
        drain: ``flush``: wait until nothing is in flight, then flush (else: under load).
        detail: what makes it adversarial, for humans (e.g. ``prefix 31 = 2 pages - 1``).
    """

    index: int
    ingredient: Ingredient
    requests: tuple[Request, ...] = ()
    delay_s: float = 0.0
    streaming: bool = False
    drain: bool = False
    detail: str = ""


def derive_shape(*, page_size: int, token_ids: tuple[int, int], max_new_tokens: int,
                 max_prompt_tokens: int | None, burst_requests: int | None,
                 chunk_tokens: int | None, max_input_tokens: int | None,
                 kv_pool_tokens: int | None) -> WorkloadShape:
    """The shape for the given arguments and server limits (None: unknown).

    ``max_input_tokens`` (the server's longest accepted prompt) bounds each prompt plus its
    generation; ``kv_pool_tokens`` bounds a request to a quarter of the pool and sizes the
    bursts: ``ceil(1.5 * pool / (mean burst request))`` requests, within [8, 256] (see
    :func:`burst_tokens`).

    Raises:
        ValueError: the limits leave no room (the message names the flag to change).
    """
    new_tokens = max_new_tokens
    if max_input_tokens is not None and new_tokens > max_input_tokens // 2:
        new_tokens = max(1, max_input_tokens // 2)
    if max_prompt_tokens is not None:
        prompt_tokens = max_prompt_tokens
    else:
        prompt_tokens = DEFAULT_MAX_PROMPT_TOKENS if max_input_tokens is None else min(
            MAX_DERIVED_PROMPT_TOKENS, max_input_tokens - new_tokens - 1)
        if kv_pool_tokens is not None:
            prompt_tokens = min(prompt_tokens, kv_pool_tokens // 4 - new_tokens)
    if max_input_tokens is not None and prompt_tokens + new_tokens > max_input_tokens:
        raise ValueError(
            f"--max-prompt-tokens={prompt_tokens} plus --max-new-tokens={new_tokens} exceed the "
            f"server's longest input ({max_input_tokens} tokens); lower them")
    low_bound = max(_MIN_PROMPT_TOKENS, 2 * page_size + 2)
    if prompt_tokens < low_bound:
        raise ValueError(
            f"prompts of at most {prompt_tokens} tokens leave no room for pages of "
            f"{page_size} (at least {low_bound} needed); lower --max-new-tokens or --page-size, "
            "or raise --max-prompt-tokens")
    if burst_requests is None:
        if kv_pool_tokens is None:
            burst_requests = DEFAULT_BURST_REQUESTS
        else:
            mean_request = sum(_burst_prompt_range(prompt_tokens, page_size)) / 2 + new_tokens
            wanted = math.ceil(_BURST_OVERCOMMIT * kv_pool_tokens / mean_request)
            burst_requests = min(max(wanted, _BURST_LIMITS[0]), _BURST_LIMITS[1])
    return WorkloadShape(page_size=page_size, token_low=token_ids[0], token_high=token_ids[1],
                         max_prompt_tokens=prompt_tokens, max_new_tokens=new_tokens,
                         chunk_tokens=chunk_tokens, burst_requests=burst_requests)


def burst_tokens(shape: WorkloadShape) -> int:
    """The KV tokens a retraction burst asks for, on average (prompts plus generations)."""
    low, high = _burst_prompt_range(shape.max_prompt_tokens, shape.page_size)
    return round(shape.burst_requests * ((low + high) / 2 + shape.max_new_tokens))


def _burst_prompt_range(max_prompt_tokens: int, page_size: int) -> tuple[int, int]:
    high = max(page_size + 2, min(512, max_prompt_tokens // 4))
    return min(max(32, page_size + 1), high), high


class _Mix:
    """The state of one sequence: its random stream, base sequences and recent prompts."""

    def __init__(self, *, shape: WorkloadShape, seed: int, rid_prefix: str) -> None:
        self.shape = shape
        self.rng = random.Random(seed)
        self.rid_prefix = rid_prefix
        self.bases = [self.ids(shape.max_prompt_tokens) for _ in range(BASE_SEQUENCES)]
        self.recent: deque[tuple[int, ...] | str] = deque(maxlen=64)

    # ------------------------------------------------------------------ pieces
    def ids(self, count: int) -> tuple[int, ...]:
        low, high = self.shape.token_low, self.shape.token_high
        return tuple(self.rng.randrange(low, high) for _ in range(count))

    def rid(self, index: int) -> str:
        return f"{self.rid_prefix}-{index:09d}"

    def new_tokens(self) -> int:
        """1, a page -1/0/+1, or random up to the maximum (within [1, max_new_tokens])."""
        page, most = self.shape.page_size, self.shape.max_new_tokens
        choice = self.rng.choice((1, page - 1, page, page + 1, 0, 0))
        if choice == 0:
            choice = self.rng.randint(1, most)
        return min(max(choice, 1), most)

    def long_new_tokens(self) -> int:
        most = self.shape.max_new_tokens
        return self.rng.randint(max(1, most // 2), most)

    def boundary_prefix(self, *, room: int) -> tuple[tuple[int, ...], str]:
        """A prefix of a base sequence of ``k * page + d`` tokens (``d`` in -1, 0, +1), at most
        ``room`` long, and its description."""
        page = self.shape.page_size
        most_pages = max(1, (room - 1) // page)
        pages = (self.rng.randint(1, min(4, most_pages)) if self.rng.random() < 0.6
                 else self.rng.randint(1, most_pages))
        offset = self.rng.choice((-1, 0, 1))
        length = min(max(pages * page + offset, 1), room)
        base = self.rng.randrange(BASE_SEQUENCES)
        sign = "+" if offset >= 0 else "-"
        return (self.bases[base][:length],
                f"base {base} prefix {length} = {pages} page(s) of {page} {sign} {abs(offset)}")

    def remember(self, prompt: tuple[int, ...] | str) -> None:
        self.recent.append(prompt)

    # ------------------------------------------------------------------ ingredients
    def page_prefix(self, index: int) -> Action:
        page, most = self.shape.page_size, self.shape.max_prompt_tokens
        suffix_length = self.rng.choice((0, 1, page - 1, page, page + 1, -1))
        if suffix_length < 0:
            suffix_length = self.rng.randint(2, 3 * page + 2)
        suffix_length = min(suffix_length, most - page - 1)  # room for a page + 1
        prefix, detail = self.boundary_prefix(room=most - suffix_length)
        prompt = prefix + self.ids(suffix_length)
        self.remember(prompt)
        return Action(index=index, ingredient=Ingredient.PAGE_PREFIX, detail=(
            f"{detail}, suffix {suffix_length}"), requests=(Request(
                rid=self.rid(index), input_ids=prompt, max_new_tokens=self.new_tokens(),
                shared_prefix=len(prefix)),))

    def repeat(self, index: int) -> Action:
        shared = 0
        if self.recent:
            prompt = self.rng.choice(self.recent)
            detail = "an earlier prompt again"
        else:
            prompt, detail = self.boundary_prefix(room=self.shape.max_prompt_tokens)
            shared = len(prompt)
            self.remember(prompt)
        request = (Request(rid=self.rid(index), text=prompt, max_new_tokens=self.new_tokens())
                   if isinstance(prompt, str) else
                   Request(rid=self.rid(index), input_ids=prompt, max_new_tokens=self.new_tokens(),
                           shared_prefix=shared))
        return Action(index=index, ingredient=Ingredient.REPEAT, requests=(request,),
                      detail=detail)

    def long_prompt(self) -> tuple[tuple[int, ...], int, str]:
        """A long prompt, how many of its leading ids come from a base, its description."""
        most, chunk = self.shape.max_prompt_tokens, self.shape.chunk_tokens
        if self.shape.chunked_prompts:
            assert chunk is not None
            chunks = self.rng.randint(1, max(1, min(3, most // chunk)))
            if self.rng.random() < 0.5:
                length = min(chunks * chunk + self.rng.choice((-1, 0, 1)), most)
                detail = f"{length} tokens = {chunks} chunk(s) of {chunk} +- 1"
            else:
                length = self.rng.randint(chunk + 1, min(most, 3 * chunk))
                detail = f"{length} tokens, chunks of {chunk}"
            length = max(length, chunk + 1)
        else:
            length = self.rng.randint(max(1, most // 2), most)
            detail = f"{length} tokens (no chunked-prefill size known)"
        if self.rng.random() < 0.5:
            prefix, prefix_detail = self.boundary_prefix(room=length)
            return (prefix + self.ids(length - len(prefix)), len(prefix),
                    f"{detail}, behind {prefix_detail}")
        return self.ids(length), 0, detail

    def long_chunked(self, index: int) -> Action:
        prompt, shared, detail = self.long_prompt()
        self.remember(prompt)
        new_tokens = min(self.rng.randint(1, 32), self.shape.max_new_tokens)
        return Action(index=index, ingredient=Ingredient.LONG_CHUNKED, detail=detail,
                      requests=(Request(rid=self.rid(index), input_ids=prompt,
                                        max_new_tokens=new_tokens, shared_prefix=shared),))

    def parallel_n(self, index: int) -> Action:
        n = self.rng.choice(PARALLEL_N)
        shared = 0
        if self.rng.random() < 0.5:
            prompt, detail = self.boundary_prefix(room=self.shape.max_prompt_tokens)
            shared = len(prompt)
        else:
            prompt = self.ids(self.rng.randint(1, min(256, self.shape.max_prompt_tokens)))
            detail = f"{len(prompt)} random tokens"
        return Action(index=index, ingredient=Ingredient.PARALLEL_N, detail=f"n={n}, {detail}",
                      requests=(Request(rid=self.rid(index), input_ids=prompt, n=n,
                                        max_new_tokens=self.new_tokens(),
                                        temperature=SAMPLING_TEMPERATURE,
                                        shared_prefix=shared),))

    def retraction_burst(self, index: int) -> Action:
        low, high = _burst_prompt_range(self.shape.max_prompt_tokens, self.shape.page_size)
        requests = []
        for member in range(self.shape.burst_requests):
            length = self.rng.randint(low, high)
            prefix = self.boundary_prefix(room=length)[0] if member % 2 else ()
            prompt = prefix + self.ids(length - len(prefix))
            requests.append(Request(rid=f"{self.rid(index)}-{member:04d}", input_ids=prompt,
                                    max_new_tokens=self.shape.max_new_tokens,
                                    shared_prefix=len(prefix)))
        return Action(index=index, ingredient=Ingredient.RETRACTION_BURST,
                      requests=tuple(requests),
                      detail=f"{len(requests)} requests of {low}-{high} + "
                             f"{self.shape.max_new_tokens} tokens at once")

    def abort(self, index: int) -> Action:
        if self.rng.random() < 1 / 3:
            prompt, _, detail = self.long_prompt()
            detail = f"during the prefill of {detail}"
        else:
            prompt = self.ids(self.rng.randint(1, min(256, self.shape.max_prompt_tokens)))
            detail = "during decode"
        delay_s = round(self.rng.uniform(0.02, 1.5), 3)
        return Action(index=index, ingredient=Ingredient.ABORT, delay_s=delay_s,
                      detail=f"/abort_request after {delay_s} s, {detail}",
                      requests=(Request(rid=self.rid(index), input_ids=prompt,
                                        max_new_tokens=self.shape.max_new_tokens),))

    def disconnect(self, index: int) -> Action:
        streaming = self.rng.random() < 0.5
        delay_s = round(self.rng.uniform(0.05, 1.0), 3)
        prompt = self.ids(self.rng.randint(1, min(256, self.shape.max_prompt_tokens)))
        return Action(index=index, ingredient=Ingredient.DISCONNECT, delay_s=delay_s,
                      streaming=streaming,
                      detail=f"{'streamed' if streaming else 'plain'} request, client gone "
                             f"after {delay_s} s",
                      requests=(Request(rid=self.rid(index), input_ids=prompt,
                                        max_new_tokens=self.long_new_tokens()),))

    def flush(self, index: int, *, drain: bool) -> Action:
        return Action(index=index, ingredient=Ingredient.FLUSH, drain=drain,
                      detail="drained: nothing in flight" if drain else "under load")

    def mixed(self, index: int) -> Action:
        kind = self.rng.random()
        if kind < 1 / 3:
            words = self.rng.randint(1, 60)
            text = " ".join(self.rng.choice(_TEXT_WORDS) for _ in range(words))
            self.remember(text)
            request = Request(rid=self.rid(index), text=text, max_new_tokens=self.new_tokens())
            detail = f"text of {words} words"
        else:
            longest = min(512, self.shape.max_prompt_tokens)
            length = self.rng.choice((1, 2, self.rng.randint(3, 64), self.rng.randint(3, longest)))
            length = min(length, longest)
            prompt = self.ids(length)
            self.remember(prompt)
            temperature = self.rng.choice((0.0, 0.0, 0.7))
            request = Request(rid=self.rid(index), input_ids=prompt, temperature=temperature,
                              max_new_tokens=self.new_tokens())
            detail = f"{length} random tokens, temperature {temperature}"
        return Action(index=index, ingredient=Ingredient.MIXED, requests=(request,),
                      detail=detail)


def actions(*, shape: WorkloadShape, seed: int, rid_prefix: str) -> Iterator[Action]:
    """The endless action sequence of ``seed`` (see the module docstring); equal arguments give
    equal actions."""
    mix = _Mix(shape=shape, seed=seed, rid_prefix=rid_prefix)
    builders = {
        Ingredient.PAGE_PREFIX: mix.page_prefix, Ingredient.REPEAT: mix.repeat,
        Ingredient.LONG_CHUNKED: mix.long_chunked, Ingredient.PARALLEL_N: mix.parallel_n,
        Ingredient.RETRACTION_BURST: mix.retraction_burst, Ingredient.ABORT: mix.abort,
        Ingredient.DISCONNECT: mix.disconnect, Ingredient.MIXED: mix.mixed,
        Ingredient.FLUSH: lambda index: mix.flush(index, drain=False),
    }
    index = 0
    round_number = 0
    while True:
        kinds = [Ingredient(name) for name, count in ROUND for _ in range(count)]
        mix.rng.shuffle(kinds)
        if round_number % DRAINED_FLUSH_EVERY_ROUNDS == 1:
            yield mix.flush(index, drain=True)
            index += 1
        for kind in kinds:
            yield builders[kind](index)
            index += 1
        round_number += 1
