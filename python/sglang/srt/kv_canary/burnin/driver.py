"""Run the burn-in's actions against a server, in threads, until a limit is reached.

:class:`Driver` submits the actions in order to a pool of ``concurrency`` worker threads (a
retraction burst takes one worker and sends its requests from threads of its own; one burst at a
time). A drained flush waits until nothing is in flight. It stops submitting at the first of:
the duration, the token budget (prompt plus generated tokens of the answers so far), the first
failure, the server gone (a started server exited), Ctrl-C; then it waits, bounded, for what
is in flight. A watcher thread prints the progress line and runs the ``/health_generate``
probes.

What counts as a failure (:func:`judge_generation` for answers): a call that cannot reach the
server or times out; a status other than 200 (``/flush_cache``: other than 200 or 400); an
answer that is not JSON of the expected shape; a request that finished otherwise than after
exactly its ``max_new_tokens`` (every request sets ``ignore_eos``), except an aborted one,
which may also finish with ``abort``; a failed health probe.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sglang.srt.kv_canary.burnin.client import Answer, Client, ClientError
from sglang.srt.kv_canary.burnin.workload import Action, Ingredient, Request

MAX_FAILURES_KEPT = 20
_WATCH_PERIOD_S = 0.2
_HEALTH_TIMEOUT_S = 60.0
_END_WAIT_MARGIN_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """When to stop sending (None: no such limit; at least one is set)."""

    duration_s: float | None
    max_tokens: int | None

    def __post_init__(self) -> None:
        if self.duration_s is None and self.max_tokens is None:
            raise ValueError("Limits: give duration_s or max_tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    """How one ``/generate`` answer went.

    Attributes:
        outcome: ``completed`` (all ``max_new_tokens`` generated), ``aborted`` (finished with
            ``abort``, only when an abort was sent) or ``failed``.
        prompt_tokens, generated_tokens, cached_tokens: summed over the answer's sequences.
        message: what was wrong (``failed`` only).
    """

    outcome: str
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    message: str = ""


def _count(meta: Mapping[str, object], key: str) -> int:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def judge_generation(request: Request, answer: Answer, *, abort_sent: bool = False) -> Judgement:
    """Judge the answer to ``request`` (see the module docstring for what fails)."""
    if not answer.ok:
        return Judgement(outcome="failed", message=(
            f"{request.rid}: /generate answered {answer.status}: {answer.excerpt()}"))
    try:
        body = answer.json()
    except ValueError:
        return Judgement(outcome="failed",
                         message=f"{request.rid}: /generate answered no JSON: {answer.excerpt()}")
    outputs = body if isinstance(body, list) else [body]
    if len(outputs) != request.n or not all(
            isinstance(o, dict) and isinstance(o.get("meta_info"), dict) for o in outputs):
        return Judgement(outcome="failed", message=(
            f"{request.rid}: /generate answered {len(outputs)} output(s) for n={request.n} "
            f"or no meta_info: {answer.excerpt()}"))
    prompt = generated = cached = 0
    aborted = False
    for output in outputs:
        meta = output["meta_info"]
        prompt += _count(meta, "prompt_tokens")
        generated += _count(meta, "completion_tokens")
        cached += _count(meta, "cached_tokens")
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else None
        if abort_sent and kind == "abort":
            aborted = True
        elif kind != "length" or _count(meta, "completion_tokens") != request.max_new_tokens:
            return Judgement(outcome="failed", prompt_tokens=prompt, generated_tokens=generated,
                             cached_tokens=cached, message=(
                f"{request.rid}: finished with {finish!r} after "
                f"{meta.get('completion_tokens')!r} of {request.max_new_tokens} tokens"))
    return Judgement(outcome="aborted" if aborted else "completed", prompt_tokens=prompt,
                     generated_tokens=generated, cached_tokens=cached)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStats:
    """What the driver did.

    Attributes:
        elapsed_s: from the first submission to the end of the wait for what was in flight.
        stop_reason: why it stopped sending.
        actions: actions started per ingredient name.
        requests: ``/generate`` calls sent (each burst member counts).
        sequences: sequences asked for (a request with ``n`` counts ``n``).
        completed: requests answered with all their tokens.
        aborted: requests that finished with ``abort`` after the burn-in's ``/abort_request``.
        abort_missed: aborted requests that had finished first.
        disconnected: requests whose client went away (or meant to).
        disconnect_missed: of those, answered (or streamed to the end) before the client left.
        prompt_tokens, generated_tokens, cached_tokens: from the answers' ``meta_info``.
        flushes, flushed, flush_refused: ``/flush_cache`` calls, and how they were answered.
        health_ok, health_failed: ``/health_generate`` probes.
        failures: the first failures' messages.
        failure_count: all failures.
        in_flight_at_end: actions still running when the final wait gave up.
    """

    elapsed_s: float
    stop_reason: str
    actions: Mapping[str, int] = field(default_factory=dict)
    requests: int = 0
    sequences: int = 0
    completed: int = 0
    aborted: int = 0
    abort_missed: int = 0
    disconnected: int = 0
    disconnect_missed: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    flushes: int = 0
    flushed: int = 0
    flush_refused: int = 0
    health_ok: int = 0
    health_failed: int = 0
    failures: tuple[str, ...] = ()
    failure_count: int = 0
    in_flight_at_end: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens


class _Tally:
    """The driver's counters (every update under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.actions: Counter[str] = Counter()
        self.failures: list[str] = []
        self.failure_count = 0

    def add(self, **increments: int) -> None:
        with self.lock:
            self.counts.update(increments)

    def judged(self, judgement: Judgement) -> None:
        with self.lock:
            self.counts.update(prompt_tokens=judgement.prompt_tokens,
                               generated_tokens=judgement.generated_tokens,
                               cached_tokens=judgement.cached_tokens)
            if judgement.outcome != "failed":
                self.counts[judgement.outcome] += 1

    def fail(self, message: str) -> None:
        with self.lock:
            self.failure_count += 1
            if len(self.failures) < MAX_FAILURES_KEPT:
                self.failures.append(message)

    def get(self, name: str) -> int:
        with self.lock:
            return self.counts[name]


class Driver:
    """Sends the actions (see the module docstring); :meth:`run` once."""

    def __init__(self, *, client: Client, actions: Iterable[Action], limits: Limits,
                 concurrency: int, progress_interval_s: float, health_interval_s: float,
                 say: Callable[[str], None],
                 server_gone: Callable[[], str | None] = lambda: None,
                 violations_so_far: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency!r} is invalid; allowed: an integer >= 1")
        self._client = client
        self._actions = actions
        self._limits = limits
        self._concurrency = concurrency
        self._progress_interval_s = progress_interval_s
        self._health_interval_s = health_interval_s
        self._say = say
        self._server_gone = server_gone
        self._violations_so_far = violations_so_far
        self._clock = clock
        self._tally = _Tally()
        self._changed = threading.Condition()
        self._in_flight = 0
        self._burst_running = False
        self._stop_reason: str | None = None
        self._gone_reported = False
        self._finished = threading.Event()
        self._started_at = 0.0

    # ------------------------------------------------------------------ stopping
    def _stop(self, reason: str) -> None:
        with self._changed:
            if self._stop_reason is None:
                self._stop_reason = reason
            self._changed.notify_all()

    def _fail(self, message: str) -> None:
        self._tally.fail(message)
        self._stop(f"a failure: {message}")

    def _elapsed(self) -> float:
        return self._clock() - self._started_at

    def _check_limits(self) -> None:
        limits = self._limits
        if limits.duration_s is not None and self._elapsed() >= limits.duration_s:
            self._stop(f"the duration ({limits.duration_s:g} s) was reached")
        tokens = self._tally.get("prompt_tokens") + self._tally.get("generated_tokens")
        if limits.max_tokens is not None and tokens >= limits.max_tokens:
            self._stop(f"the token budget ({limits.max_tokens}) was reached")
        if not self._gone_reported:
            gone = self._server_gone()
            if gone is not None:
                with self._changed:
                    first, self._gone_reported = not self._gone_reported, True
                if first:
                    self._fail(gone)

    def _stopping(self) -> bool:
        self._check_limits()
        with self._changed:
            return self._stop_reason is not None

    # ------------------------------------------------------------------ run
    def run(self) -> RunStats:
        """Send actions until a limit; wait for what is in flight; the stats."""
        self._started_at = self._clock()
        watcher = threading.Thread(target=self._watch, name="burnin-watch", daemon=True)
        watcher.start()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self._concurrency,
                                                     thread_name_prefix="burnin")
        longest_wait_s = self._client.timeout_s + _END_WAIT_MARGIN_S
        try:
            for action in self._actions:
                if not self._admit(action):
                    break
                pool.submit(self._run_action, action)
        except KeyboardInterrupt:
            self._stop("interrupted (Ctrl-C)")
        finally:
            try:
                self._wait(lambda: self._in_flight == 0, timeout_s=longest_wait_s)
            except KeyboardInterrupt:
                self._stop("interrupted (Ctrl-C)")
            pool.shutdown(wait=False, cancel_futures=True)
            self._finished.set()
            watcher.join(timeout=_HEALTH_TIMEOUT_S)
        stats = self._stats()
        self._say(self._progress_line(final=True))
        return stats

    def _wait(self, done: Callable[[], bool], *, timeout_s: float | None,
              or_stopping: bool = False) -> bool:
        """Wait until ``done()`` (checked under the lock), ``timeout_s`` passed, or (with
        ``or_stopping``) a stop; whether ``done()`` holds."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        while True:
            if or_stopping and self._stopping():
                return False
            with self._changed:
                if done():
                    return True
                if deadline is not None and self._clock() >= deadline:
                    return False
                self._changed.wait(0.1)

    def _admit(self, action: Action) -> bool:
        """Wait until ``action`` may start (a free worker; no burst running for a burst;
        nothing in flight for a drained flush) and count it in; False: stop instead."""
        is_burst = action.ingredient is Ingredient.RETRACTION_BURST

        def ready() -> bool:
            if action.drain:
                return self._in_flight == 0
            if is_burst and self._burst_running:
                return False
            return self._in_flight < self._concurrency

        if not self._wait(ready, timeout_s=None, or_stopping=True):
            return False
        with self._changed:
            self._in_flight += 1
            self._burst_running = self._burst_running or is_burst
        with self._tally.lock:
            self._tally.actions[action.ingredient.value] += 1
        return True

    def _run_action(self, action: Action) -> None:
        label = f"{action.ingredient.value} #{action.index}"
        try:
            if action.ingredient is Ingredient.FLUSH:
                self._flush(label)
            elif action.ingredient is Ingredient.RETRACTION_BURST:
                self._burst(action)
            elif action.ingredient is Ingredient.ABORT:
                self._abort(action)
            elif action.ingredient is Ingredient.DISCONNECT:
                self._disconnect(action)
            else:
                (request,) = action.requests
                self._generate(request)
        except ClientError as error:
            self._fail(f"{label}: {error}")
        except Exception as error:  # noqa: BLE001 - a bug here must still end the run cleanly
            self._fail(f"{label}: internal error {type(error).__name__}: {error}")
        finally:
            with self._changed:
                self._in_flight -= 1
                if action.ingredient is Ingredient.RETRACTION_BURST:
                    self._burst_running = False
                self._changed.notify_all()

    # ------------------------------------------------------------------ actions
    def _sent(self, request: Request) -> None:
        self._tally.add(requests=1, sequences=request.n)

    def _judge(self, request: Request, answer: Answer, *, abort_sent: bool = False) -> str:
        judgement = judge_generation(request, answer, abort_sent=abort_sent)
        self._tally.judged(judgement)
        if judgement.outcome == "failed":
            self._fail(judgement.message)
        return judgement.outcome

    def _generate(self, request: Request) -> None:
        self._sent(request)
        self._judge(request, self._client.generate(request.payload()))

    def _burst(self, action: Action) -> None:
        def one(request: Request) -> None:
            try:
                self._generate(request)
            except ClientError as error:
                self._fail(f"retraction_burst #{action.index}: {error}")

        with concurrent.futures.ThreadPoolExecutor(
                max_workers=len(action.requests), thread_name_prefix="burnin-burst") as burst:
            list(burst.map(one, action.requests))

    def _abort(self, action: Action) -> None:
        (request,) = action.requests
        result: dict[str, Answer | ClientError] = {}

        def send() -> None:
            try:
                result["answer"] = self._client.generate(request.payload())
            except ClientError as error:
                result["error"] = error

        self._sent(request)
        sender = threading.Thread(target=send, name="burnin-abortee", daemon=True)
        sender.start()
        time.sleep(action.delay_s)
        abort_answer = self._client.abort(request.rid)
        if not abort_answer.ok:
            self._fail(f"abort #{action.index}: /abort_request answered {abort_answer.status}: "
                       f"{abort_answer.excerpt()}")
        sender.join(timeout=self._client.timeout_s + 5.0)
        outcome = result.get("answer", result.get("error"))
        if isinstance(outcome, ClientError):
            raise outcome
        if outcome is None:
            self._fail(f"abort #{action.index}: {request.rid} got no answer within "
                       f"{self._client.timeout_s + 5.0:g} s")
            return
        if self._judge(request, outcome, abort_sent=True) == "completed":
            self._tally.add(abort_missed=1)

    def _disconnect(self, action: Action) -> None:
        (request,) = action.requests
        self._sent(request)
        outcome = self._client.generate_then_leave(request.payload(), after_s=action.delay_s,
                                                   streaming=action.streaming)
        self._tally.add(disconnected=1)
        if outcome.answer is not None:
            self._judge(request, outcome.answer)
        if outcome.finished:
            self._tally.add(disconnect_missed=1)

    def _flush(self, label: str) -> None:
        answer = self._client.flush_cache()
        self._tally.add(flushes=1)
        if answer.status == 200:
            self._tally.add(flushed=1)
        elif answer.status == 400:
            self._tally.add(flush_refused=1)
        else:
            self._fail(f"{label}: /flush_cache answered {answer.status}: {answer.excerpt()}")

    # ------------------------------------------------------------------ watcher
    def _watch(self) -> None:
        next_progress = self._progress_interval_s or None
        next_health = self._health_interval_s or None
        probe: threading.Thread | None = None
        while not self._finished.wait(_WATCH_PERIOD_S):
            self._check_limits()
            elapsed = self._elapsed()
            if next_progress is not None and elapsed >= next_progress:
                self._say(self._progress_line(final=False))
                next_progress += self._progress_interval_s
            if next_health is not None and elapsed >= next_health and (
                    probe is None or not probe.is_alive()):
                probe = threading.Thread(target=self._probe_health, name="burnin-health",
                                         daemon=True)
                probe.start()
                next_health = elapsed + self._health_interval_s
        if probe is not None:
            probe.join(timeout=_HEALTH_TIMEOUT_S)

    def _probe_health(self) -> None:
        timeout_s = min(self._client.timeout_s, _HEALTH_TIMEOUT_S)
        try:
            answer = self._client.health(timeout_s=timeout_s)
        except ClientError as error:
            self._tally.add(health_failed=1)
            self._fail(f"health probe: {error}")
            return
        if answer.ok:
            self._tally.add(health_ok=1)
        else:
            self._tally.add(health_failed=1)
            self._fail(f"health probe: /health_generate answered {answer.status}: "
                       f"{answer.excerpt()}")

    def _progress_line(self, *, final: bool) -> str:
        with self._tally.lock:
            counts = Counter(self._tally.counts)
            failures = self._tally.failure_count
        with self._changed:
            in_flight = self._in_flight
        limit = self._limits.duration_s
        clock = f"{self._elapsed():.0f}" + (f"/{limit:g}" if limit is not None else "") + " s"
        budget = f"/{self._limits.max_tokens}" if self._limits.max_tokens is not None else ""
        violations = ("?" if self._violations_so_far is None
                      else str(self._violations_so_far()))
        return (f"{'done' if final else 'progress'} {clock}: {counts['requests']} requests "
                f"({in_flight} actions in flight), "
                f"{counts['prompt_tokens'] + counts['generated_tokens']}{budget} tokens, "
                f"{counts['aborted']} aborted, {counts['disconnected']} disconnected, "
                f"flushes {counts['flushed']}/{counts['flushes']}, "
                f"health {counts['health_ok']}/{counts['health_ok'] + counts['health_failed']}, "
                f"failures {failures}, violations {violations}")

    def _stats(self) -> RunStats:
        with self._tally.lock:
            counts = Counter(self._tally.counts)
            actions = dict(self._tally.actions)
            failures = tuple(self._tally.failures)
            failure_count = self._tally.failure_count
        with self._changed:
            reason = self._stop_reason or "the action sequence ended"
            in_flight = self._in_flight
        return RunStats(
            elapsed_s=self._elapsed(), stop_reason=reason, actions=MappingProxyType(actions),
            failures=failures, failure_count=failure_count, in_flight_at_end=in_flight,
            **{name: counts[name] for name in (
                "requests", "sequences", "completed", "aborted", "abort_missed", "disconnected",
                "disconnect_missed", "prompt_tokens", "generated_tokens", "cached_tokens",
                "flushes", "flushed", "flush_refused", "health_ok", "health_failed")},
        )
