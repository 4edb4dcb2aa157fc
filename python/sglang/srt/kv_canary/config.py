"""The one configuration layer of the KV canary.

Every knob is an ``SGLANG_KV_CANARY_*`` environment variable, declared once in :data:`KNOBS`
(name, parser, default, allowed values, meaning, and when it has no effect). That table drives
parsing, validation and the README's configuration table (:func:`markdown_table`; a test keeps
the README identical to it). The variables are read once, at plugin load, into the frozen
dataclasses below; no other module of this package reads ``os.environ``.

Refused, with a :class:`CanaryConfigError` that names the variable, the value and what is
allowed: a malformed value, an unknown ``SGLANG_KV_CANARY_*`` name (with the closest known name
suggested), and a variable that is set to something other than its "off" value in a
configuration where it would have no effect (e.g. ``RING_CAPACITY`` with the canary off): a
typo or a forgotten switch must never leave a check silently disabled.

Five knobs also have a ``launch_server`` flag (:data:`LAUNCH_FLAGS`: ``--kv-canary``,
``--kv-canary-on-violation``, ``--kv-canary-real-data``, ``--kv-canary-sweep-interval``,
``--kv-canary-report-path``), read
from the command line by the same parsing: a flag counts as its variable, and a flag and its
variable both set to different values is refused naming both. SGLang's scheduler processes are
spawned with the command line of the ``launch_server`` process, so every process reads the same
flags.

What the canary does with a violation is one setting, :attr:`CanaryConfig.mode`, named by two
variables: ``SGLANG_KV_CANARY_ON_VIOLATION=log|abort|raise`` (the documented name; setting it turns
the canary on) and ``SGLANG_KV_CANARY_MODE=none|log|abort|raise`` (the original name, which alone
can say ``none``). Both set must agree (compared parsed), else the launch stops naming both.

This module imports only the standard library: it is what runs when the canary is off.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

ENV_PREFIX = "SGLANG_KV_CANARY_"


class CanaryConfigError(ValueError):
    """A ``SGLANG_KV_CANARY_*`` setting is invalid; the message says which and why."""


class CanaryMode(enum.Enum):
    """What the canary does with a violation."""

    NONE = "none"  # no canary
    LOG = "log"  # log every violation row, keep serving
    ABORT = "abort"  # log, abort the requests that read the reported slots, evict their cache
    RAISE = "raise"  # raise in the scheduler at the first violation


class RealDataMode(enum.Enum):
    """How much of a slot's real K/V bytes goes into its fingerprint (K and V of the first and
    the last layer)."""

    NONE = "none"
    PARTIAL = "partial"  # 16 bytes of each of the four rows, at an offset rotating with the slot;
    # a verify reads one row per prefix slot (see hashing.due_source_scalar)
    ALL = "all"  # every byte of the four rows


class KvSubPool(enum.Enum):
    """Which sub-pool's K/V bytes the real-data perturbations flip (a hybrid sliding-window pool
    has two)."""

    ANY = "any"
    FULL = "full"  # the full-attention buffers (every pool has them)
    WINDOW = "window"  # the sliding-window buffers, inside a row's window


@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbConfig:
    """Fault injection (self-test only). Probabilities are per forward step (the host-tier
    faults ``real_kv_host`` and ``load_shift``: per load-back SGLang starts)."""

    warmup_steps: int = 50
    seed: int = 0
    next_token_swap_prob: float = 0.0
    req_to_token_prob: float = 0.0
    foreign_prefix_prob: float = 0.0
    real_kv_used_prob: float = 0.0
    real_kv_unused_cache_prob: float = 0.0
    real_kv_post_forward_prob: float = 0.0
    lost_write_prob: float = 0.0
    input_ids_prob: float = 0.0
    seq_lens_prob: float = 0.0
    window_table_prob: float = 0.0
    real_kv_host_prob: float = 0.0  # per load-back
    load_shift_prob: float = 0.0  # per load-back
    kv_sub_pool: KvSubPool = KvSubPool.ANY

    def enabled_probabilities(self) -> dict[str, float]:
        """The perturbations with a non-zero probability, by short name."""
        return {
            name.removesuffix("_prob"): getattr(self, name)
            for name in (f.name for f in dataclasses.fields(self))
            if name.endswith("_prob") and getattr(self, name) > 0.0
        }

    @property
    def any_enabled(self) -> bool:
        return bool(self.enabled_probabilities())


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryConfig:
    """Everything the environment says about the canary, validated."""

    mode: CanaryMode = CanaryMode.NONE
    real_data: RealDataMode = RealDataMode.NONE
    real_data_stride: int = 1
    sweep_interval: int = 0
    enable_token_oracle: bool = False
    enable_write_input_assert: bool = False
    enable_verify_token_assert: bool = False
    ring_capacity: int = 1024
    stats_print_every_n_steps: int = 100
    health_check_every_n_steps: int = 100
    reinject_padded_row_bug: bool = False
    # the forensics report file (absolute; None: no file), see monitor/report_file.py
    report_path: str | None = None
    perturb: PerturbConfig = field(default_factory=PerturbConfig)
    # the command line names a canary flag or asks for help: launch_server's parser must know
    # the flags (the one hook registered with everything else off)
    launch_flags: bool = False

    @property
    def canary_enabled(self) -> bool:
        """True when the per-slot records are kept and verified."""
        return self.mode is not CanaryMode.NONE

    @property
    def anything_enabled(self) -> bool:
        """False means: register no hook, import nothing more."""
        return self.canary_enabled or self.enable_token_oracle

    @property
    def token_history_enabled(self) -> bool:
        """Either token check reads the requests' token histories."""
        return self.canary_enabled and (
            self.enable_verify_token_assert or self.enable_write_input_assert
        )

    def describe(self) -> str:
        """One human-readable line of what is enabled, for the start-up log."""
        parts = [f"mode={self.mode.value}"]
        if self.canary_enabled:
            parts.append(f"real_data={self.real_data.value}")
            if self.real_data_stride > 1:
                parts.append(f"real_data_stride={self.real_data_stride}")
            parts.append(f"sweep_interval={self.sweep_interval}")
            parts.append(f"ring_capacity={self.ring_capacity}")
            parts.append(f"stats_every={self.stats_print_every_n_steps}")
            parts.append(f"health_check_every={self.health_check_every_n_steps}")
            if self.reinject_padded_row_bug:
                parts.append("padded_row_fix=OFF (bug re-injected)")
            if self.report_path is not None:
                parts.append(f"report_path={self.report_path}")
        parts.append(f"token_oracle={_on_off(self.enable_token_oracle)}")
        if self.canary_enabled:
            parts.append(f"write_input_assert={_on_off(self.enable_write_input_assert)}")
            parts.append(f"verify_token_assert={_on_off(self.enable_verify_token_assert)}")
        perturbations = self.perturb.enabled_probabilities()
        if perturbations:
            listed = ",".join(f"{name}:{prob:g}" for name, prob in perturbations.items())
            parts.append(
                f"perturb=[{listed}] warmup_steps={self.perturb.warmup_steps} "
                f"seed={self.perturb.seed}"
            )
        else:
            parts.append("perturb=none")
        return "KV canary enabled: " + " ".join(parts)


def _on_off(value: bool) -> str:
    return "on" if value else "off"


# ----------------------------------------------------------------------------- parsers

_E = TypeVar("_E", bound=enum.Enum)
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})
Parser = Callable[[str, str], Any]  # (variable name, raw text) -> value; raises CanaryConfigError


def _error(name: str, raw: str, allowed: str) -> CanaryConfigError:
    return CanaryConfigError(f"{name}={raw!r} is invalid; allowed: {allowed}")


def _enum_parser(enum_type: type[_E]) -> Parser:
    def parse(name: str, raw: str) -> _E:
        text = raw.strip().lower()
        for member in enum_type:
            if member.value == text:
                return member
        raise _error(name, raw, ", ".join(member.value for member in enum_type))

    return parse


def _parse_bool(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise _error(name, raw, "1/0, true/false, yes/no, on/off")


def _int_parser(*, minimum: int, maximum: int | None = None) -> Parser:
    allowed = f"an integer >= {minimum}" if maximum is None else (
        f"an integer in [{minimum}, {maximum}]"
    )

    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise _error(name, raw, allowed) from None
        if value < minimum or (maximum is not None and value > maximum):
            raise _error(name, raw, allowed)
        return value

    return parse


def _parse_on_violation(name: str, raw: str) -> CanaryMode | None:
    """``log``, ``abort`` or ``raise`` (any case); None for empty text (unset)."""
    text = raw.strip().lower()
    if not text:
        return None
    for member in (CanaryMode.LOG, CanaryMode.ABORT, CanaryMode.RAISE):
        if member.value == text:
            return member
    raise _error(name, raw, "log, abort, raise")


_REPORT_PATH_ALLOWED = (
    "a path to a file this process can create or append to (unset or empty: no file)"
)


def _parse_report_path(name: str, raw: str) -> str | None:
    """The absolute path of the report file, or None for empty text (no file).

    Checks, without creating anything, that the file could be opened for appending: it is not a
    directory and is writable, or it does not exist and its directory exists and is writable
    (the scheduler opens it at start-up and fails the same way if that changed meanwhile).
    """
    text = raw.strip()
    if not text:
        return None
    path = os.path.abspath(os.path.expanduser(text))
    reason = _unwritable_reason(path)
    if reason is not None:
        raise CanaryConfigError(
            f"{name}={raw!r} is invalid: {reason}; allowed: {_REPORT_PATH_ALLOWED}"
        )
    return path


def _unwritable_reason(path: str) -> str | None:
    """Why ``path`` cannot be opened for appending, or None when it can (as far as the
    permissions say)."""
    if os.path.isdir(path):
        return f"{path} is a directory"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else f"{path} is not writable (permission denied)"
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        return f"directory {directory} does not exist"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"cannot create a file in {directory} (permission denied)"
    return None


def _parse_probability(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise _error(name, raw, "a probability in [0, 1]") from None
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise _error(name, raw, "a probability in [0, 1]")
    return value


# ----------------------------------------------------------------------------- "has no effect"

_MODE = ENV_PREFIX + "MODE"
_ON_VIOLATION = ENV_PREFIX + "ON_VIOLATION"
_ORACLE = ENV_PREFIX + "ENABLE_TOKEN_ORACLE"
_SWEEP = ENV_PREFIX + "SWEEP_INTERVAL"
NoEffect = Callable[[CanaryConfig], "str | None"]  # why a setting does nothing here, or None


def _needs_canary(config: CanaryConfig) -> str | None:
    if config.canary_enabled:
        return None
    return (f"{_MODE}=none (the canary is off); set {_ON_VIOLATION}=log, abort or raise "
            f"(or {_MODE})")


def _needs_oracle(config: CanaryConfig) -> str | None:
    if config.enable_token_oracle:
        return None
    return f"it compares against or perturbs the token oracle's tokens; set {_ORACLE}=1"


def _needs_canary_and_oracle(config: CanaryConfig) -> str | None:
    return _needs_canary(config) or _needs_oracle(config)


def _needs_a_perturbation(config: CanaryConfig) -> str | None:
    if config.perturb.any_enabled:
        return None
    return f"no perturbation is enabled (every {ENV_PREFIX}PERTURB_*_PROB is 0)"


def _needs_real_data(config: CanaryConfig) -> str | None:
    if reason := _needs_canary(config):
        return reason
    if config.real_data is not RealDataMode.NONE:
        return None
    return f"{ENV_PREFIX}REAL_DATA=none (no bytes are fingerprinted); set it to partial or all"


def _needs_real_kv_perturbation(config: CanaryConfig) -> str | None:
    perturb = config.perturb
    if perturb.real_kv_used_prob or perturb.real_kv_unused_cache_prob \
            or perturb.real_kv_post_forward_prob:
        return None
    return "no real_kv_* perturbation is enabled (it chooses their sub-pool)"


def _needs_sweep(config: CanaryConfig) -> str | None:
    if reason := _needs_canary(config):
        return reason
    if config.sweep_interval > 0:
        return None
    return f"only the radix sweep sees cached slots no request uses; set {_SWEEP} >= 1"


def _always_effective(config: CanaryConfig) -> str | None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """One environment variable: where its value goes, how it is parsed, what it means, and
    when setting it would have no effect."""

    suffix: str
    field: str  # attribute of CanaryConfig, or "perturb.<attribute>"
    parse: Parser
    default: str
    allowed: str  # for the README table and error messages
    meaning: str
    off_value: str | None  # a value that switches the feature off (accepted anywhere)
    no_effect: NoEffect
    # another name of the setting ``field`` (set: it must agree with the knob that owns ``field``;
    # its value then applies, see :func:`_apply_aliases`)
    alias: bool = False

    @property
    def name(self) -> str:
        return ENV_PREFIX + self.suffix


def _probability(suffix: str, meaning: str, no_effect: NoEffect = _needs_canary) -> Knob:
    return Knob(
        suffix=suffix, field="perturb." + suffix.removeprefix("PERTURB_").lower(),
        parse=_parse_probability, default="0", allowed="probability in [0, 1]", meaning=meaning,
        off_value="0", no_effect=no_effect,
    )


KNOBS: tuple[Knob, ...] = (
    Knob(suffix="ON_VIOLATION", field="mode", parse=_parse_on_violation, default="",
         allowed="log, abort, raise",
         meaning="turns the canary on and says what a violation does: log: logged, serving goes "
                 "on; abort: logged, every request whose forward read or wrote a reported slot "
                 "is finished with an error (HTTP 500 / an abort chunk), the radix-cache nodes "
                 "holding it are evicted, serving goes on; raise: the first violation raises in "
                 "the scheduler (unset: see MODE)",
         off_value="", no_effect=_always_effective, alias=True),
    Knob(suffix="MODE", field="mode", parse=_enum_parser(CanaryMode), default="none",
         allowed="none, log, abort, raise",
         meaning="the same setting as ON_VIOLATION, which it must equal when both are set; "
                 "none: no canary",
         off_value="none", no_effect=_always_effective),
    Knob(suffix="REAL_DATA", field="real_data", parse=_enum_parser(RealDataMode),
         default="none", allowed="none, partial, all",
         meaning="fingerprint of the real KV bytes per slot: 4 sources of the first and last "
                 "layer (MHA: K and V; MLA: latent and RoPE; FP4: values and scales; partial: 16 "
                 "bytes of each, rotating with the slot; the post-forward verify reads one "
                 "source per prefix slot, rotating with position and step)",
         off_value="none", no_effect=_needs_canary),
    Knob(suffix="REAL_DATA_STRIDE", field="real_data_stride",
         parse=_int_parser(minimum=1, maximum=1 << 20), default="1",
         allowed="integer in [1, 1048576]",
         meaning="the post-forward verify checks the real bytes of a request's prefix position p "
                 "in the forwards whose step s has (p + s) % N == 0: each prefix slot every N "
                 "forwards, at 1/N of the cost (1: every slot in every forward; partial reads the "
                 "slot's source number (p + s) / N modulo its 4 sources)",
         off_value="1", no_effect=_needs_real_data),
    Knob(suffix="SWEEP_INTERVAL", field="sweep_interval", parse=_int_parser(minimum=0),
         default="0", allowed="integer >= 0",
         meaning="every N steps verify every slot held by the radix cache (0: off)",
         off_value="0", no_effect=_needs_canary),
    Knob(suffix="ENABLE_TOKEN_ORACLE", field="enable_token_oracle", parse=_parse_bool,
         default="0", allowed="boolean",
         meaning="per-request int ids + the token_oracle sampling backend",
         off_value="0", no_effect=_always_effective),
    Knob(suffix="ENABLE_WRITE_INPUT_ASSERT", field="enable_write_input_assert",
         parse=_parse_bool, default="0", allowed="boolean",
         meaning="check the input_ids/positions the model consumes against expectations",
         off_value="0", no_effect=_needs_canary_and_oracle),
    Knob(suffix="ENABLE_VERIFY_TOKEN_ASSERT", field="enable_verify_token_assert",
         parse=_parse_bool, default="0", allowed="boolean",
         meaning="check each verified slot's stored token against the request's history",
         off_value="0", no_effect=_needs_canary),
    Knob(suffix="RING_CAPACITY", field="ring_capacity", parse=_int_parser(minimum=1),
         default="1024", allowed="integer >= 1",
         meaning="violation rows kept on the device between two reads by the host",
         off_value=None, no_effect=_needs_canary),
    Knob(suffix="STATS_PRINT_EVERY_N_STEPS", field="stats_print_every_n_steps",
         parse=_int_parser(minimum=0), default="100", allowed="integer >= 0",
         meaning="periodic 'protected N tokens, W slots written, K violations' line (0: off)",
         off_value="0", no_effect=_needs_canary),
    Knob(suffix="HEALTH_CHECK_EVERY_N_STEPS", field="health_check_every_n_steps",
         parse=_int_parser(minimum=1), default="100", allowed="integer >= 1",
         meaning="how often the 'health ok' line confirms every forward ran the canary",
         off_value=None, no_effect=_needs_canary),
    Knob(suffix="REINJECT_PADDED_ROW_BUG", field="reinject_padded_row_bug", parse=_parse_bool,
         default="0", allowed="boolean",
         meaning="debug: leave SGLang 0.5.12's stale padded CUDA-graph rows unfixed, to see "
                 "what the canary reports (padded_row)",
         off_value="0", no_effect=_needs_canary),
    Knob(suffix="REPORT_PATH", field="report_path", parse=_parse_report_path, default="",
         allowed="file path",
         meaning="forensics file: the scheduler appends one JSON object per line (a header, "
                 "every violation row with its request's rid, forward mode and batch size, "
                 "repeats included and marked, each ring overflow); read it with `python -m "
                 "sglang.srt.kv_canary.report FILE` (unset: no file)",
         off_value="", no_effect=_needs_canary),
    Knob(suffix="PERTURB_WARMUP_STEPS", field="perturb.warmup_steps",
         parse=_int_parser(minimum=0), default="50", allowed="integer >= 0",
         meaning="no perturbation before this many forward steps (next_token_swap: calls of "
                 "the oracle sampler)",
         off_value=None, no_effect=_needs_a_perturbation),
    Knob(suffix="PERTURB_SEED", field="perturb.seed", parse=_int_parser(minimum=0),
         default="0", allowed="integer >= 0",
         meaning="seed of the perturbations' random choices (runs reproduce)",
         off_value=None, no_effect=_needs_a_perturbation),
    _probability("PERTURB_NEXT_TOKEN_SWAP_PROB",
                 "swap two requests' sampled tokens at the oracle sampler's exit",
                 no_effect=_needs_oracle),
    _probability("PERTURB_REQ_TO_TOKEN_PROB",
                 "point a live request's req_to_token entry at another live request's slot"),
    _probability("PERTURB_FOREIGN_PREFIX_PROB",
                 "point a live request's whole prefix at another live request's (a consistent "
                 "but foreign history: only the ownership check sees it)"),
    _probability("PERTURB_REAL_KV_USED_PROB", "flip a byte of a live slot's K/V"),
    _probability("PERTURB_REAL_KV_UNUSED_CACHE_PROB",
                 "flip a byte of a cached slot no live request uses", no_effect=_needs_sweep),
    _probability("PERTURB_REAL_KV_POST_FORWARD_PROB", "flip a byte of a slot just written"),
    _probability("PERTURB_LOST_WRITE_PROB",
                 "send the model's K/V write of one new token of an eager forward to slot 0 (the "
                 "canary sees the intended slot)"),
    _probability("PERTURB_INPUT_IDS_PROB",
                 "overwrite one row's input token right before the forward"),
    _probability("PERTURB_WINDOW_TABLE_PROB",
                 "point a live in-window slot's sliding-window mapping entry at another live "
                 "slot's window slot (hybrid sliding-window pools)"),
    _probability("PERTURB_REAL_KV_HOST_PROB",
                 "per load-back from the hierarchical cache's host tier: flip a byte in each "
                 "16-byte window of one fingerprinted row of a loaded page's host copy",
                 no_effect=_needs_real_data),
    _probability("PERTURB_LOAD_SHIFT_PROB",
                 "per load-back of two pages or more from the host tier: copy each page (KV "
                 "and records) into the previous page's device slots (the first into the "
                 "last's)"),
    Knob(suffix="PERTURB_KV_SUB_POOL", field="perturb.kv_sub_pool",
         parse=_enum_parser(KvSubPool), default="any", allowed="any, full, window",
         meaning="which sub-pool the real_kv_* perturbations flip bytes in (window: a hybrid "
                 "pool's sliding-window buffers, inside the row's window)",
         off_value="any", no_effect=_needs_real_kv_perturbation),
    _probability("PERTURB_SEQ_LENS_PROB",
                 "one forward reads a copy of seq_lens with one live row's entry one larger "
                 "(its host mirror keeps the true value)"),
)
KNOWN_NAMES: frozenset[str] = frozenset(knob.name for knob in KNOBS)

# Knobs this release does not implement yet: refused when switched on, never silently ignored.
NOT_YET_IMPLEMENTED: frozenset[str] = frozenset()


def markdown_table() -> str:
    """The README's configuration table, generated from :data:`KNOBS`."""
    lines = ["| variable | values | default | meaning |", "|---|---|---|---|"]
    for knob in KNOBS:
        meaning = knob.meaning
        if knob.suffix in NOT_YET_IMPLEMENTED:
            meaning += " — not implemented yet, refused"
        default = f"`{knob.default}`" if knob.default else "unset"
        lines.append(f"| `{knob.name}` | {knob.allowed} | {default} | {meaning} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- parsing


def _reject_unknown_names(environ: Mapping[str, str]) -> None:
    unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in KNOWN_NAMES)
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(KNOWN_NAMES), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"unknown variable {name}={environ[name]!r}{hint}")
    raise CanaryConfigError(
        "; ".join(lines) + " (known SGLANG_KV_CANARY_* variables: "
        + ", ".join(sorted(KNOWN_NAMES)) + ")"
    )


# ----------------------------------------------------------------------------- launch flags

# flag -> the suffix of the variable it stands for
LAUNCH_FLAGS: Mapping[str, str] = {
    "--kv-canary": "MODE",
    "--kv-canary-on-violation": "ON_VIOLATION",
    "--kv-canary-real-data": "REAL_DATA",
    "--kv-canary-sweep-interval": "SWEEP_INTERVAL",
    "--kv-canary-report-path": "REPORT_PATH",
}
LAUNCH_FLAG_PREFIX = "--kv-canary"
_HELP_FLAGS = ("-h", "--help")


def flags_from_argv(argv: Sequence[str]) -> dict[str, tuple[str, str]]:
    """The canary flags of a command line: ``{variable name: (flag, raw value)}``, taking
    ``--flag value`` and ``--flag=value``.

    Raises:
        CanaryConfigError: an argument starting with ``--kv-canary`` that is not one of the flags
            (abbreviations included: a flag is named whole), a flag without a value, or a flag
            given twice with different values.
    """
    found: dict[str, tuple[str, str]] = {}
    index = 0
    while index < len(argv):
        argument = argv[index]
        index += 1
        if not argument.startswith(LAUNCH_FLAG_PREFIX):
            continue
        flag, equals, value = argument.partition("=")
        if flag not in LAUNCH_FLAGS:
            close = difflib.get_close_matches(flag, list(LAUNCH_FLAGS), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise CanaryConfigError(
                f"unknown flag {flag}{hint} (the KV canary's flags: {', '.join(LAUNCH_FLAGS)})"
            )
        if not equals:
            following = argv[index] if index < len(argv) else None
            if following is None or (following.startswith("-")
                                     and not following[1:].isdigit()):  # "-1": a value
                raise CanaryConfigError(f"{flag} needs a value")
            value = argv[index]
            index += 1
        name = ENV_PREFIX + LAUNCH_FLAGS[flag]
        if name in found and found[name][1] != value:
            raise CanaryConfigError(
                f"{flag} is given twice: {found[name][1]!r} and {value!r}; give it once"
            )
        found[name] = (flag, value)
    return found


def _with_flags(environ: Mapping[str, str],
                flags: Mapping[str, tuple[str, str]]) -> Mapping[str, str]:
    """``environ`` with each flag standing for its variable.

    Raises:
        CanaryConfigError: a flag and its variable are both set, to different values (compared
            parsed: ``--kv-canary LOG`` agrees with ``SGLANG_KV_CANARY_MODE=log``).
    """
    if not flags:
        return environ
    merged = dict(environ)
    knobs = {knob.name: knob for knob in KNOBS}
    for name, (flag, value) in flags.items():
        knob = knobs[name]
        parsed = knob.parse(f"{flag}", value)
        if name in environ and knob.parse(name, environ[name]) != parsed:
            raise CanaryConfigError(
                f"{flag} {value} and {name}={environ[name]!r} disagree; set one of them, or both "
                "to the same value"
            )
        merged[name] = value
    return merged


def parse_config(environ: Mapping[str, str], *, argv: Sequence[str] = ()) -> CanaryConfig:
    """Build and validate the configuration from an environment mapping and a command line
    (its canary flags: :func:`flags_from_argv`).

    Raises:
        CanaryConfigError: a value is malformed, a name or flag is unknown, a flag and its
            variable disagree, a feature is not implemented, or a variable is set where it would
            have no effect.
    """
    flags = flags_from_argv(argv)
    launch_flags = bool(flags) or any(argument in _HELP_FLAGS for argument in argv)
    environ = _with_flags(environ, flags)
    _reject_unknown_names(environ)
    top: dict[str, Any] = {}
    perturb: dict[str, Any] = {}
    for knob in KNOBS:
        if knob.alias:
            continue
        value = knob.parse(knob.name, environ.get(knob.name, knob.default))
        section, _, attribute = knob.field.rpartition(".")
        (perturb if section == "perturb" else top)[attribute] = value
    _apply_aliases(environ, top)
    config = CanaryConfig(**top, perturb=PerturbConfig(**perturb), launch_flags=launch_flags)
    for knob in KNOBS:
        raw = environ.get(knob.name)
        if raw is None or _is_off(knob, raw):
            continue
        if knob.suffix in NOT_YET_IMPLEMENTED:
            raise CanaryConfigError(
                f"{knob.name}={raw!r}: not implemented in this release of sglang-kv-canary; "
                f"allowed: {knob.off_value} (or unset it)"
            )
        reason = knob.no_effect(config)
        if reason is not None:
            raise CanaryConfigError(
                f"{knob.name}={raw!r} would have no effect: {reason}; "
                f"or unset {knob.name}"
            )
    return config


def _apply_aliases(environ: Mapping[str, str], top: dict[str, Any]) -> None:
    """Each alias knob that is set: its value replaces its field's, after checking that the
    field's own knob, when set too, says the same.

    Raises:
        CanaryConfigError: both are set to different values (naming both).
    """
    owners = {knob.field: knob for knob in KNOBS if not knob.alias}
    for knob in KNOBS:
        if not knob.alias or knob.name not in environ:
            continue
        value = knob.parse(knob.name, environ[knob.name])
        if value is None:
            continue
        owner = owners[knob.field]
        if owner.name in environ and owner.parse(owner.name, environ[owner.name]) != value:
            raise CanaryConfigError(
                f"{knob.name}={environ[knob.name]!r} and {owner.name}={environ[owner.name]!r} "
                f"disagree; set one of them (allowed: {knob.allowed}), or both to the same value"
            )
        top[knob.field] = value


def _is_off(knob: Knob, raw: str) -> bool:
    """True when ``raw`` means the same as the knob's off value (always valid)."""
    if knob.off_value is None:
        return False
    return knob.parse(knob.name, raw) == knob.parse(knob.name, knob.off_value)


# ----------------------------------------------------------------------------- the one read

_active_config: CanaryConfig | None = None


def load_config_from_environment(*, argv: Sequence[str] = ()) -> CanaryConfig:
    """Read ``os.environ`` (and the canary flags of ``argv``, the process's command line without
    the program) once per process and cache the result.

    The only place in the package that reads the environment. Raises
    :class:`CanaryConfigError` on invalid settings.
    """
    global _active_config
    if _active_config is None:
        _active_config = parse_config(os.environ, argv=argv)
    return _active_config


def get_active_config() -> CanaryConfig:
    """The configuration the plugin was activated with.

    Raises:
        RuntimeError: the plugin has not loaded the configuration in this process.
    """
    if _active_config is None:
        raise RuntimeError(
            "the KV canary configuration was not loaded in this process; "
            "it is loaded by the sglang.srt.plugins entry point 'kv_canary'"
        )
    return _active_config


def set_active_config_for_testing(config: CanaryConfig | None) -> None:
    """Replace the cached configuration (tests only)."""
    global _active_config
    _active_config = config


if __name__ == "__main__":
    print(markdown_table())
