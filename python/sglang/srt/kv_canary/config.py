"""The one configuration layer of the KV canary.

Every knob is an ``SGLANG_KV_CANARY_*`` environment variable. They are read once, at plugin
load, into the frozen dataclasses below and validated there; no other module of this package
reads ``os.environ``. A bad value, an unknown ``SGLANG_KV_CANARY_*`` name, or a combination
that would silently leave a check or a perturbation without effect raises
:class:`CanaryConfigError`, whose message names the variable, the value and what is allowed.

This module imports only the standard library: it is what runs when the canary is off.
"""

from __future__ import annotations

import difflib
import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

ENV_PREFIX = "SGLANG_KV_CANARY_"


class CanaryConfigError(ValueError):
    """A ``SGLANG_KV_CANARY_*`` setting is invalid; the message says which and why."""


class CanaryMode(enum.Enum):
    """What the canary does with a violation."""

    NONE = "none"  # no canary
    LOG = "log"  # log every violation row, keep serving
    RAISE = "raise"  # raise in the scheduler at the first violation


class RealDataMode(enum.Enum):
    """How much of the real K/V bytes of a slot goes into its fingerprint."""

    NONE = "none"
    PARTIAL = "partial"  # the first 16 bytes of the slot's K row in the first layer
    ALL = "all"  # every byte of the slot's K row in the first layer


@dataclass(frozen=True, slots=True, kw_only=True)
class _Variable:
    """One environment variable: its name suffix, default text and description."""

    suffix: str
    default: str
    allowed: str
    meaning: str

    @property
    def name(self) -> str:
        return ENV_PREFIX + self.suffix


# The table of every variable this package reads (README's table is generated from the same
# facts; a test keeps them in sync).
VARIABLES: tuple[_Variable, ...] = (
    _Variable(suffix="MODE", default="none", allowed="none, log, raise",
              meaning="none: no canary; log: violations logged, serving goes on; "
                      "raise: the first violation raises in the scheduler"),
    _Variable(suffix="REAL_DATA", default="none", allowed="none, partial, all",
              meaning="fingerprint of the real K/V bytes per slot (partial: first 16 bytes)"),
    _Variable(suffix="SWEEP_INTERVAL", default="0", allowed="integer >= 0",
              meaning="every N steps verify every slot held by the radix cache (0: off)"),
    _Variable(suffix="ENABLE_TOKEN_ORACLE", default="0", allowed="boolean",
              meaning="per-request int ids + the token_oracle sampling backend"),
    _Variable(suffix="ENABLE_WRITE_INPUT_ASSERT", default="0", allowed="boolean",
              meaning="check the input_ids/positions the model consumes against expectations"),
    _Variable(suffix="ENABLE_VERIFY_TOKEN_ASSERT", default="0", allowed="boolean",
              meaning="check each verified slot's stored token against the request's history"),
    _Variable(suffix="RING_CAPACITY", default="1024", allowed="integer >= 1",
              meaning="violation rows kept on the device"),
    _Variable(suffix="STATS_PRINT_EVERY_N_STEPS", default="100", allowed="integer >= 0",
              meaning="periodic 'protected N tokens, M sweeps, K violations' line (0: off)"),
    _Variable(suffix="HEALTH_CHECK_EVERY_N_STEPS", default="100", allowed="integer >= 1",
              meaning="how often the health check confirms every expected kernel ran"),
    _Variable(suffix="PERTURB_WARMUP_STEPS", default="50", allowed="integer >= 0",
              meaning="no perturbation before this many forward steps "
                      "(next_token_swap: calls of the oracle sampler)"),
    _Variable(suffix="PERTURB_SEED", default="0", allowed="integer >= 0",
              meaning="seed of the perturbations' random choices (runs reproduce)"),
    _Variable(suffix="PERTURB_NEXT_TOKEN_SWAP_PROB", default="0", allowed="probability in [0, 1]",
              meaning="swap two requests' sampled tokens at the oracle sampler's exit"),
    _Variable(suffix="PERTURB_REQ_TO_TOKEN_PROB", default="0", allowed="probability in [0, 1]",
              meaning="point a live request's req_to_token entry at another live request's slot"),
    _Variable(suffix="PERTURB_REAL_KV_USED_PROB", default="0", allowed="probability in [0, 1]",
              meaning="flip a byte of a live slot's K/V"),
    _Variable(suffix="PERTURB_REAL_KV_UNUSED_CACHE_PROB", default="0",
              allowed="probability in [0, 1]",
              meaning="flip a byte of a cached slot no live request uses"),
    _Variable(suffix="PERTURB_REAL_KV_POST_FORWARD_PROB", default="0",
              allowed="probability in [0, 1]",
              meaning="flip a byte of a slot just written"),
    _Variable(suffix="PERTURB_INPUT_IDS_PROB", default="0", allowed="probability in [0, 1]",
              meaning="overwrite one row's input token right before the forward"),
)
KNOWN_NAMES: frozenset[str] = frozenset(v.name for v in VARIABLES)


@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbConfig:
    """Fault injection (self-test only). Probabilities are per forward step."""

    warmup_steps: int = 50
    seed: int = 0
    next_token_swap_prob: float = 0.0
    req_to_token_prob: float = 0.0
    real_kv_used_prob: float = 0.0
    real_kv_unused_cache_prob: float = 0.0
    real_kv_post_forward_prob: float = 0.0
    input_ids_prob: float = 0.0

    def enabled_probabilities(self) -> dict[str, float]:
        """The perturbations with a non-zero probability, by short name."""
        candidates = {
            "next_token_swap": self.next_token_swap_prob,
            "req_to_token": self.req_to_token_prob,
            "real_kv_used": self.real_kv_used_prob,
            "real_kv_unused_cache": self.real_kv_unused_cache_prob,
            "real_kv_post_forward": self.real_kv_post_forward_prob,
            "input_ids": self.input_ids_prob,
        }
        return {name: prob for name, prob in candidates.items() if prob > 0.0}

    @property
    def any_enabled(self) -> bool:
        return bool(self.enabled_probabilities())


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryConfig:
    """Everything the environment says about the canary, validated."""

    mode: CanaryMode = CanaryMode.NONE
    real_data: RealDataMode = RealDataMode.NONE
    sweep_interval: int = 0
    enable_token_oracle: bool = False
    enable_write_input_assert: bool = False
    enable_verify_token_assert: bool = False
    ring_capacity: int = 1024
    stats_print_every_n_steps: int = 100
    health_check_every_n_steps: int = 100
    perturb: PerturbConfig = field(default_factory=PerturbConfig)

    @property
    def canary_enabled(self) -> bool:
        """True when the per-slot records are kept and verified."""
        return self.mode is not CanaryMode.NONE

    @property
    def anything_enabled(self) -> bool:
        """False means: register no hook, import nothing more."""
        return self.canary_enabled or self.enable_token_oracle

    def describe(self) -> str:
        """One human-readable line of what is enabled, for the start-up log."""
        parts = [f"mode={self.mode.value}"]
        if self.canary_enabled:
            parts.append(f"real_data={self.real_data.value}")
            parts.append(f"sweep_interval={self.sweep_interval}")
            parts.append(f"ring_capacity={self.ring_capacity}")
            parts.append(f"stats_every={self.stats_print_every_n_steps}")
            parts.append(f"health_check_every={self.health_check_every_n_steps}")
        parts.append(f"token_oracle={'on' if self.enable_token_oracle else 'off'}")
        if self.canary_enabled:
            parts.append(f"write_input_assert={'on' if self.enable_write_input_assert else 'off'}")
            parts.append(f"verify_token_assert={'on' if self.enable_verify_token_assert else 'off'}")
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


# ----------------------------------------------------------------------------- parsing

_E = TypeVar("_E", bound=enum.Enum)
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def _error(name: str, raw: str, allowed: str) -> CanaryConfigError:
    return CanaryConfigError(f"{name}={raw!r} is invalid; allowed: {allowed}")


def _parse_enum(enum_type: type[_E]) -> Callable[[str, str], _E]:
    def parse(name: str, raw: str) -> _E:
        text = raw.strip().lower()
        for member in enum_type:
            if member.value == text:
                return member
        allowed = ", ".join(member.value for member in enum_type)
        raise _error(name, raw, allowed)

    return parse


def _parse_bool(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise _error(name, raw, "1/0, true/false, yes/no, on/off")


def _parse_int(*, minimum: int) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise _error(name, raw, f"an integer >= {minimum}") from None
        if value < minimum:
            raise _error(name, raw, f"an integer >= {minimum}")
        return value

    return parse


def _parse_probability(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise _error(name, raw, "a probability in [0, 1]") from None
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise _error(name, raw, "a probability in [0, 1]")
    return value


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


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CanaryConfigError(message)


def parse_config(environ: Mapping[str, str]) -> CanaryConfig:
    """Build and validate the configuration from an environment mapping.

    Raises:
        CanaryConfigError: a value is malformed, a name is unknown, or a combination of settings
            would leave something silently without effect.
    """
    _reject_unknown_names(environ)
    defaults = {v.name: v.default for v in VARIABLES}

    def get(suffix: str, parse: Callable[[str, str], object]) -> object:
        name = ENV_PREFIX + suffix
        return parse(name, environ.get(name, defaults[name]))

    perturb = PerturbConfig(
        warmup_steps=get("PERTURB_WARMUP_STEPS", _parse_int(minimum=0)),
        seed=get("PERTURB_SEED", _parse_int(minimum=0)),
        next_token_swap_prob=get("PERTURB_NEXT_TOKEN_SWAP_PROB", _parse_probability),
        req_to_token_prob=get("PERTURB_REQ_TO_TOKEN_PROB", _parse_probability),
        real_kv_used_prob=get("PERTURB_REAL_KV_USED_PROB", _parse_probability),
        real_kv_unused_cache_prob=get("PERTURB_REAL_KV_UNUSED_CACHE_PROB", _parse_probability),
        real_kv_post_forward_prob=get("PERTURB_REAL_KV_POST_FORWARD_PROB", _parse_probability),
        input_ids_prob=get("PERTURB_INPUT_IDS_PROB", _parse_probability),
    )
    config = CanaryConfig(
        mode=get("MODE", _parse_enum(CanaryMode)),
        real_data=get("REAL_DATA", _parse_enum(RealDataMode)),
        sweep_interval=get("SWEEP_INTERVAL", _parse_int(minimum=0)),
        enable_token_oracle=get("ENABLE_TOKEN_ORACLE", _parse_bool),
        enable_write_input_assert=get("ENABLE_WRITE_INPUT_ASSERT", _parse_bool),
        enable_verify_token_assert=get("ENABLE_VERIFY_TOKEN_ASSERT", _parse_bool),
        ring_capacity=get("RING_CAPACITY", _parse_int(minimum=1)),
        stats_print_every_n_steps=get("STATS_PRINT_EVERY_N_STEPS", _parse_int(minimum=0)),
        health_check_every_n_steps=get("HEALTH_CHECK_EVERY_N_STEPS", _parse_int(minimum=1)),
        perturb=perturb,
    )
    _validate_combinations(config)
    return config


# Knobs of the spec this release does not implement yet: refused, never silently ignored.
_NOT_YET_IMPLEMENTED: dict[str, Callable[[CanaryConfig], bool]] = {
    "SWEEP_INTERVAL": lambda c: c.sweep_interval > 0,
    "PERTURB_REAL_KV_UNUSED_CACHE_PROB": lambda c: c.perturb.real_kv_unused_cache_prob > 0,
    "PERTURB_REAL_KV_POST_FORWARD_PROB": lambda c: c.perturb.real_kv_post_forward_prob > 0,
}


def _validate_combinations(config: CanaryConfig) -> None:
    """Reject settings that would have no effect: nothing may be silently disabled."""
    mode_name = ENV_PREFIX + "MODE"
    needs_canary = {
        "REAL_DATA": config.real_data is not RealDataMode.NONE,
        "SWEEP_INTERVAL": config.sweep_interval > 0,
        "ENABLE_WRITE_INPUT_ASSERT": config.enable_write_input_assert,
        "ENABLE_VERIFY_TOKEN_ASSERT": config.enable_verify_token_assert,
        "PERTURB_REQ_TO_TOKEN_PROB": config.perturb.req_to_token_prob > 0,
        "PERTURB_REAL_KV_USED_PROB": config.perturb.real_kv_used_prob > 0,
        "PERTURB_REAL_KV_UNUSED_CACHE_PROB": config.perturb.real_kv_unused_cache_prob > 0,
        "PERTURB_REAL_KV_POST_FORWARD_PROB": config.perturb.real_kv_post_forward_prob > 0,
        "PERTURB_INPUT_IDS_PROB": config.perturb.input_ids_prob > 0,
    }
    for suffix, is_set in needs_canary.items():
        _require(
            not is_set or config.canary_enabled,
            f"{ENV_PREFIX}{suffix} is set but {mode_name}=none, so it would do nothing; "
            f"set {mode_name}=log or raise, or unset {ENV_PREFIX}{suffix}",
        )
    oracle_name = ENV_PREFIX + "ENABLE_TOKEN_ORACLE"
    for suffix, is_set in {
        "ENABLE_WRITE_INPUT_ASSERT": config.enable_write_input_assert,
        "PERTURB_NEXT_TOKEN_SWAP_PROB": config.perturb.next_token_swap_prob > 0,
    }.items():
        _require(
            not is_set or config.enable_token_oracle,
            f"{ENV_PREFIX}{suffix} needs the token oracle (it compares against / perturbs "
            f"oracle tokens); set {oracle_name}=1",
        )
    _require(
        config.perturb.real_kv_unused_cache_prob == 0 or config.sweep_interval > 0,
        f"{ENV_PREFIX}PERTURB_REAL_KV_UNUSED_CACHE_PROB is set but "
        f"{ENV_PREFIX}SWEEP_INTERVAL=0: only the sweep can see unused cached slots; "
        f"set {ENV_PREFIX}SWEEP_INTERVAL >= 1",
    )
    for suffix, is_set in _NOT_YET_IMPLEMENTED.items():
        _require(
            not is_set(config),
            f"{ENV_PREFIX}{suffix} is not implemented in this release of sglang-kv-canary; "
            f"unset it (see README, 'Not yet implemented')",
        )


# ----------------------------------------------------------------------------- the one read

_active_config: CanaryConfig | None = None


def load_config_from_environment() -> CanaryConfig:
    """Read ``os.environ`` once per process and cache the result.

    The only place in the package that reads the environment. Raises
    :class:`CanaryConfigError` on invalid settings.
    """
    global _active_config
    if _active_config is None:
        _active_config = parse_config(os.environ)
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
