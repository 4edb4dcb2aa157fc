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

Decode steps replay CUDA graphs: the launch wrappers (``launch_before_model`` /
``launch_after_model``) and the extend-forward functions run only in eager forwards, so their
``xcalls`` is the share of eager forwards and their mean is per eager (mostly EXTEND) forward.
"""

from __future__ import annotations

import functools
import gc
import importlib
import logging
import os
import time


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



def extra_timed(value: str) -> tuple[tuple[str, str], ...]:
    """The value of ``KV_CANARY_HOST_TIMERS_EXTRA``: ``module:attribute.path`` items, comma
    separated (empty: none).

    Raises:
        ValueError: an item without ``:``, naming the variable and the item.
    """
    items = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        module, colon, path = item.partition(":")
        if not (colon and module and path):
            raise ValueError(
                f"KV_CANARY_HOST_TIMERS_EXTRA item {item!r} is invalid; allowed: "
                "module:attribute.path (e.g. sglang.srt.kv_canary.runner.request_rows:_pack)"
            )
        items.append((module, path))
    return tuple(items)


_EXTRA = extra_timed(os.environ.get("KV_CANARY_HOST_TIMERS_EXTRA", ""))

_totals: dict[str, list[float]] = {}


def _wrap(name: str, function):
    entry = _totals.setdefault(name, [0.0, 0])
    first = name == TIMED[0][1]

    @functools.wraps(function)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            entry[0] += time.perf_counter() - start
            entry[1] += 1
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


def _install() -> None:
    for module_name, path in _EXTRA + TIMED:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # a module this SGLang does not have: leave it untimed
            continue
        owner, _, attribute = path.rpartition(".")
        holder = getattr(module, owner, None) if owner else module
        if holder is None or not hasattr(holder, attribute):  # another version: leave it out
            continue
        setattr(holder, attribute, _wrap(path, getattr(holder, attribute)))


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
