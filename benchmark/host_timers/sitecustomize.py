"""Wall-clock timers around the KV canary's host-side functions, inside a real server.

Put this folder first on ``PYTHONPATH`` and set ``KV_CANARY_HOST_TIMERS=N``: every Python process
then wraps the functions of :data:`TIMED` with ``time.perf_counter`` (no tracer: the figures are
real host costs, unlike a profiler's), and the process that runs forwards logs one line every
``N`` forwards: ``KV canary host timers over N forwards: name mean_us x calls_per_forward, ...``.
Used by ``bench_server_overhead.py --host-timers``; never imported by the package itself.

``KV_CANARY_HOST_TIMERS_EXTRA="module:Attr.path,module:function,..."`` times more functions
(wrapped first, so a module that later imports one of them by name gets the timed one). A module
or attribute that the installed code does not have is left out, so one list serves several
versions of the package.

Two of SGLang's scheduler functions that run no canary code, ``Scheduler.recv_requests`` and
``Scheduler.get_next_batch_to_run``, are timed as controls: their mean per call compares how
fast each server process ran (servers started in turn on one machine can differ by up to 1.5x),
so a ratio between two servers can be read against its control (where both servers call it
equally often per forward: idle passes of the scheduler loop are in the same means).

Garbage collections are timed too, as ``gc.gen0`` / ``gc.gen1`` / ``gc.gen2`` (mean time per
collection and collections per forward): a collection runs inside whatever call allocated last,
so its time is in that function's mean as well.

``KV_CANARY_HOST_TIMERS_BURN_US=N`` (with the timers on) adds N us of plain Python work with a
working set of about 2.5 MB before every ``ModelRunner.forward``: a stand-in for N us of extra
host work per step that is not the canary, to see whether extra host work alone slows the
controls.

``KV_CANARY_HOST_PROFILE="module:Attr.path,..."`` (with the timers on) runs ``cProfile`` inside
every call of those functions, C calls (torch's, CUDA's) included, from the
``KV_CANARY_HOST_PROFILE_SKIP``-th call on (default 200: after the warm-up) for
``KV_CANARY_HOST_PROFILE_CALLS`` calls (default 200), then logs once ``KV canary host profile
over N calls of NAMES:`` and the 30 functions with the most own time, each as ``own_us
cumulative_us xcalls`` per call of the first name, then ``KV canary host profile by cumulative
time over ...`` with the 30 of the most cumulative time. The profiler slows the Python it traces, so
read its shares, not its totals; the timers give the real totals.

A timed function called with a ``forward_batch=`` keyword (the canary runner's hooks:
``on_init_new``, ``run_forward``, ...) or with a batch that has a ``forward_mode`` as its first
argument after ``self`` (``ModelRunner.forward``, ``Scheduler.run_batch``,
``Scheduler.process_batch_result``) is also timed per forward mode, as ``NAME[EXTEND]``,
``NAME[DECODE]``, ...: a prefill's call apart from the decode steps' (``xcalls`` is then that
mode's calls per forward). At batch 1 a request's first token waits for its prefill's
``run_batch[EXTEND]``, the first decode step's ``run_batch[DECODE]`` (SGLang's overlap loop
enqueues it first) and the prefill's ``process_batch_result[EXTEND]``, which waits for the
device to finish the prefill.

Decode steps replay CUDA graphs: the launch wrappers (``launch_before_model`` /
``launch_after_model``) and the extend-forward functions run only in eager forwards, so their
``xcalls`` is the share of eager forwards and their mean is per eager (mostly EXTEND) forward.

``KV_CANARY_SYNC_CHECK=1`` (independent of the timers) turns on torch's CUDA sync debug mode
(``torch.cuda.set_sync_debug_mode("warn")``) in the process that serves, once the canary's
start-up is over (``CanaryRunner.on_serving_start``, after the graphs are captured), and counts
every synchronizing call torch reports by the Python line that made it: a line in a
``kv_canary`` module is the canary's (its first call is logged at once with its stack), any other
line is SGLang's own. Every 256 forwards the process logs ``KV canary sync check over N
forwards: canary C, elsewhere E`` with the canary lines seen. torch does not report every sync
(a copy from pageable host memory, ``Event.synchronize``): zero means none of the kinds it
reports.
"""

from __future__ import annotations

import cProfile
import functools
import gc
import importlib
import logging
import os
import pstats
import time
import traceback
import warnings


def _non_negative(value: str, *, variable: str, meaning: str) -> int:
    """``value`` of the environment variable ``variable`` as an integer >= 0 (empty: 0).

    Raises:
        ValueError: anything else, naming the variable, the value and what is allowed
            (``meaning``). Python prints it at start-up as "Error in sitecustomize" and runs on
            without timers.
    """
    try:
        number = int(value or "0")
    except ValueError:
        number = -1
    if number < 0:
        raise ValueError(f"{variable}={value!r} is invalid; allowed: an integer >= 0 ({meaning})")
    return number


def every_n_forwards(value: str) -> int:
    """The value of ``KV_CANARY_HOST_TIMERS``: the forwards per timer line (0 or empty: off)."""
    return _non_negative(value, variable="KV_CANARY_HOST_TIMERS",
                         meaning="the forwards per timer line; 0 or unset: off")


def burn_us(value: str) -> int:
    """The value of ``KV_CANARY_HOST_TIMERS_BURN_US`` (0 or empty: none)."""
    return _non_negative(value, variable="KV_CANARY_HOST_TIMERS_BURN_US",
                         meaning="us of plain Python work before every ModelRunner.forward; "
                                 "0 or unset: none")


_EVERY = every_n_forwards(os.environ.get("KV_CANARY_HOST_TIMERS", ""))
_BURN_US = burn_us(os.environ.get("KV_CANARY_HOST_TIMERS_BURN_US", ""))
_BURN_DATA = [list(range(start, start + 64)) for start in range(4000)] if _BURN_US else []


def _burn(micros: int) -> None:
    """Plain Python work for ``micros`` us, walking :data:`_BURN_DATA` (about 2.5 MB)."""
    end = time.perf_counter() + micros / 1e6
    index = 0
    while time.perf_counter() < end:
        sum(_BURN_DATA[index % len(_BURN_DATA)])
        index += 7


def _add_burn(model_runner_class: type, micros: int) -> None:
    """Run :func:`_burn` before every ``forward`` of ``model_runner_class``."""
    forward = model_runner_class.forward

    @functools.wraps(forward)
    def forward_after_burn(*args, **kwargs):
        _burn(micros)
        return forward(*args, **kwargs)

    model_runner_class.forward = forward_after_burn

# (module, attribute path) of every timed function; the first one counts the forwards
TIMED = (
    ("sglang.srt.model_executor.model_runner", "ModelRunner.forward"),
    # before the modules that import them by name
    ("sglang.jit_kernel.kv_canary.kernel_inputs", "check_scatter_inputs"),
    ("sglang.jit_kernel.kv_canary.kernel_inputs", "check_hash_oracle_inputs"),
    ("triton.runtime.jit", "JITFunction.run"),
    ("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner.on_init_new"),
    ("sglang.srt.kv_canary.runner.request_rows", "RequestRows.prepare"),
    ("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner._upload"),
    ("sglang.srt.kv_canary.token_history.history", "TokenHistory.upload"),
    ("sglang.srt.kv_canary.runner.request_rows", "RequestRows.commit"),
    ("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner.on_decode_replay"),
    ("sglang.srt.kv_canary.runner.graph_padding", "point_padded_rows_at_row_zero"),
    ("sglang.srt.kv_canary.monitor.monitor", "CanaryMonitor.poll"),
    ("sglang.srt.kv_canary.monitor.monitor", "CanaryMonitor.after_forward"),
    ("sglang.srt.kv_canary.token_oracle.sampler", "OracleSampler.forward"),
    ("sglang.srt.kv_canary.token_oracle.manager", "TokenOracleManager.sample_next_tokens_by_request"),
    ("sglang.srt.kv_canary.monitor.counter_snapshots", "CounterSnapshotPipe.enqueue"),
    ("sglang.srt.kv_canary.monitor.counter_mailbox", "CounterMailbox.publish"),
    ("sglang.srt.kv_canary.monitor.counter_mailbox", "CounterMailbox.read"),
    ("sglang.srt.kv_canary.monitor.health", "HealthChecker.check"),
    ("sglang.srt.layers.sampler", "Sampler.forward"),
    # a request's path to its first token: the prefill's run_batch, the first decode step's,
    # then the prefill's result processing (which waits for the device); split by mode
    ("sglang.srt.managers.scheduler", "Scheduler.run_batch"),
    ("sglang.srt.managers.scheduler", "Scheduler.process_batch_result"),
    # controls: scheduler work that runs no canary code
    ("sglang.srt.managers.scheduler", "Scheduler.recv_requests"),
    ("sglang.srt.managers.scheduler", "Scheduler.get_next_batch_to_run"),
    # eager (extend) forwards
    ("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner.launch_before_model"),
    ("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner.launch_after_model"),
    ("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner._extend_expectations"),
    ("sglang.srt.kv_canary.token_history.write_expectations", "WriteExpectations.compute"),
    ("sglang.srt.kv_canary.runner.request_rows", "RequestRows.prepare_deferred"),
)



def extra_timed(value: str, *, variable: str = "KV_CANARY_HOST_TIMERS_EXTRA"
                ) -> tuple[tuple[str, str], ...]:
    """The value of ``variable`` (``KV_CANARY_HOST_TIMERS_EXTRA`` or ``KV_CANARY_HOST_PROFILE``):
    ``module:attribute.path`` items, comma separated (empty: none).

    Raises:
        ValueError: an item without ``:``, naming the variable and the item.
    """
    items = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        module, colon, path = item.partition(":")
        if not (colon and module and path):
            raise ValueError(
                f"{variable} item {item!r} is invalid; allowed: "
                "module:attribute.path (e.g. sglang.srt.kv_canary.runner.request_rows:_pack)"
            )
        items.append((module, path))
    return tuple(items)


_EXTRA = extra_timed(os.environ.get("KV_CANARY_HOST_TIMERS_EXTRA", ""))
_PROFILED = extra_timed(os.environ.get("KV_CANARY_HOST_PROFILE", ""),
                        variable="KV_CANARY_HOST_PROFILE")
_PROFILE_SKIP = _non_negative(os.environ.get("KV_CANARY_HOST_PROFILE_SKIP", "200"),
                              variable="KV_CANARY_HOST_PROFILE_SKIP",
                              meaning="calls of the first profiled function before profiling")
_PROFILE_CALLS = _non_negative(os.environ.get("KV_CANARY_HOST_PROFILE_CALLS", "200"),
                               variable="KV_CANARY_HOST_PROFILE_CALLS",
                               meaning="calls of the first profiled function profiled")
_PROFILE_ROWS = 30


class _CallProfile:
    """One ``cProfile.Profile`` enabled inside the profiled functions' calls (outermost only),
    from the first name's ``skip``-th call for ``calls`` calls; then one log report."""

    def __init__(self, *, names: tuple[str, ...], skip: int, calls: int) -> None:
        self._names = names
        self._skip = skip
        self._calls = calls
        self._seen = 0  # calls of the first name
        self._depth = 0
        self._done = False
        self._profile = cProfile.Profile()

    def wrap(self, name: str, function):
        first = name == self._names[0]

        @functools.wraps(function)
        def profiled(*args, **kwargs):
            if self._done:
                return function(*args, **kwargs)
            if first:
                self._seen += 1
            active = self._seen > self._skip
            if active and self._depth == 0:
                self._profile.enable()
            self._depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1
                if active and self._depth == 0:
                    self._profile.disable()
                    if first and self._seen >= self._skip + self._calls:
                        self._report()

        return profiled

    def _report(self) -> None:
        self._done = True
        stats = pstats.Stats(self._profile)
        calls = self._calls or 1
        items = [item for item in stats.stats.items() if "_lsprof.Profiler" not in item[0][2]]
        # (the profiler's own disable call left out)
        logger = logging.getLogger("kv_canary_host_timers")
        for order, column in (("", 2), (" by cumulative time", 3)):
            rows = sorted(items, key=lambda item: item[1][column], reverse=True)
            parts = [
                f"{pstats.func_std_string(function)} {own / calls * 1e6:.1f}us "
                f"{cumulative / calls * 1e6:.1f}us x{count / calls:.2f}"
                for function, (_, count, own, cumulative, _) in rows[:_PROFILE_ROWS]
            ]
            logger.warning(
                f"KV canary host profile{order} over {self._calls} calls of "
                f"{', '.join(self._names)}: " + "; ".join(parts)
            )


_totals: dict[str, list[float]] = {}


def _mode_of(args: tuple, kwargs: dict) -> str | None:
    """The forward mode's name (``EXTEND``, ``DECODE``, ...) of a call given a
    ``forward_batch=`` keyword (the canary runner's hooks) or whose first argument after
    ``self`` has a ``forward_mode`` (``Scheduler.run_batch``, ``Scheduler.process_batch_result``,
    ``ModelRunner.forward``), else None."""
    batch = kwargs.get("forward_batch", args[1] if len(args) > 1 else None)
    mode = getattr(batch, "forward_mode", None)
    return getattr(mode, "name", None)


def _wrap(name: str, function):
    entry = _totals.setdefault(name, [0.0, 0])
    first = name == TIMED[0][1]

    @functools.wraps(function)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            entry[0] += elapsed
            entry[1] += 1
            mode = _mode_of(args, kwargs)
            if mode is not None:  # also per forward mode: a prefill's call apart from a step's
                by_mode = _totals.setdefault(f"{name}[{mode}]", [0.0, 0])
                by_mode[0] += elapsed
                by_mode[1] += 1
            if first and entry[1] % _EVERY == 0:
                _report()

    return timed


def _report() -> None:
    forwards = _totals[TIMED[0][1]][1] or 1
    parts = [
        f"{name} {total / calls * 1e6:.1f}us x{calls / forwards:.2f}"
        for name, (total, calls) in _totals.items() if calls
    ]
    logging.getLogger("kv_canary_host_timers").warning(
        f"KV canary host timers over {forwards} forwards: " + ", ".join(parts)
    )
    for entry in _totals.values():
        entry[0], entry[1] = 0.0, 0


_gc_started_at = [0.0]


def _time_garbage_collection(phase: str, info: dict) -> None:
    """``gc.callbacks`` entry: each collection's time under ``gc.genN`` (a collection makes
    whatever function triggered it look slower; this shows how much of that is the collector)."""
    if phase == "start":
        _gc_started_at[0] = time.perf_counter()
        return
    entry = _totals.setdefault(f"gc.gen{info['generation']}", [0.0, 0])
    entry[0] += time.perf_counter() - _gc_started_at[0]
    entry[1] += 1


def _resolve(module_name: str, path: str):
    """(holder, attribute) of ``module:path``, or None where the installed code lacks it."""
    try:
        module = importlib.import_module(module_name)
    except Exception:  # a module this SGLang does not have
        return None
    owner, _, attribute = path.rpartition(".")
    holder = getattr(module, owner, None) if owner else module
    if holder is None or not hasattr(holder, attribute):  # another version
        return None
    return holder, attribute


def _install() -> None:
    if _PROFILED:
        profile = _CallProfile(names=tuple(path for _, path in _PROFILED), skip=_PROFILE_SKIP,
                               calls=_PROFILE_CALLS)
        for module_name, path in _PROFILED:
            found = _resolve(module_name, path)
            if found is not None:
                setattr(found[0], found[1], profile.wrap(path, getattr(*found)))
    for module_name, path in _EXTRA + TIMED:
        found = _resolve(module_name, path)
        if found is not None:  # what the installed code lacks is left untimed
            setattr(found[0], found[1], _wrap(path, getattr(*found)))


if _EVERY > 0:
    _install()
    gc.callbacks.append(_time_garbage_collection)
    if _BURN_US > 0:
        try:
            from sglang.srt.model_executor.model_runner import ModelRunner
        except Exception:  # not an SGLang process
            ModelRunner = None
        if ModelRunner is not None:
            _add_burn(ModelRunner, _BURN_US)


SYNC_CHECK_EVERY = 256  # forwards between two sync-check log lines
_SYNC_MESSAGE = "called a synchronizing CUDA operation"


class _SyncCheck:
    """Counts the synchronizing calls torch's sync debug mode reports, by calling line."""

    def __init__(self) -> None:
        self.canary: dict[str, int] = {}
        self.elsewhere = 0
        self.forwards = 0
        self._show = warnings.showwarning

    def start(self) -> None:
        import torch

        warnings.filterwarnings("always", message=f".*{_SYNC_MESSAGE}")
        warnings.showwarning = self._on_warning
        torch.cuda.set_sync_debug_mode("warn")
        logging.getLogger("kv_canary_sync_check").warning(
            "KV canary sync check: CUDA sync debug mode on"
        )

    def stop(self) -> None:
        """Sync debug mode off and the warning display restored (for a check in a test)."""
        import torch

        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._show

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if _SYNC_MESSAGE not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        if "kv_canary" not in filename:
            self.elsewhere += 1
            return None
        site = f"{filename}:{lineno}"
        if site not in self.canary:
            stack = "".join(traceback.format_stack(limit=12)[:-1])
            logging.getLogger("kv_canary_sync_check").warning(
                f"KV canary sync check: canary code synchronized at {site}:\n{stack}"
            )
        self.canary[site] = self.canary.get(site, 0) + 1
        return None

    def count_forward(self) -> None:
        self.forwards += 1
        if self.forwards % SYNC_CHECK_EVERY == 0:
            sites = ", ".join(f"{site} x{count}" for site, count in self.canary.items())
            logging.getLogger("kv_canary_sync_check").warning(
                f"KV canary sync check over {self.forwards} forwards: canary "
                f"{sum(self.canary.values())}, elsewhere {self.elsewhere}"
                + (f" ({sites})" if sites else "")
            )


def _install_sync_check() -> None:
    check = _SyncCheck()
    serving = _resolve("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner.on_serving_start")
    forward = _resolve("sglang.srt.model_executor.model_runner", "ModelRunner.forward")
    if serving is None or forward is None:  # not a process that serves
        return
    on_serving_start = getattr(*serving)
    model_forward = getattr(*forward)

    @functools.wraps(on_serving_start)
    def start_then_check(*args, **kwargs):
        result = on_serving_start(*args, **kwargs)
        check.start()
        return result

    @functools.wraps(model_forward)
    def counted(*args, **kwargs):
        try:
            return model_forward(*args, **kwargs)
        finally:
            check.count_forward()

    setattr(serving[0], serving[1], start_then_check)
    setattr(forward[0], forward[1], counted)


def sync_check_enabled(value: str) -> bool:
    """``KV_CANARY_SYNC_CHECK``: ``1`` on, ``0`` or empty off.

    Raises:
        ValueError: any other value, naming the variable and what is allowed.
    """
    if value not in ("", "0", "1"):
        raise ValueError(f"KV_CANARY_SYNC_CHECK={value!r} is invalid; allowed: 1 (on), 0 or "
                         "empty (off)")
    return value == "1"


if sync_check_enabled(os.environ.get("KV_CANARY_SYNC_CHECK", "")):
    _install_sync_check()
