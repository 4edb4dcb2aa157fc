"""The configurations every benchmark compares.

- ``stock``: SGLang without the plugin (``SGLANG_PLUGINS=none``: the plugin loader's whitelist
  names no plugin), with SGLang's default flags. The baseline of every ratio: what a user runs
  without the canary.
- ``off``: the plugin installed and loaded, no ``SGLANG_KV_CANARY_*`` set, SGLang's default
  flags. ``off / stock`` must read 1.000x: canary off costs nothing.
- ``off+flags``: ``off`` with the flags the canary needs (:data:`CANARY_FLAGS`: SGLang 0.5.12
  enables piecewise CUDA graphs by default and the canary refuses them). ``off+flags / stock``
  is what those flags cost; the canary configurations' own cost is their ratio to it.
- ``canary``: ``SGLANG_KV_CANARY_MODE=log``, with the canary's flags: what a user sets to find
  out whether a deployment corrupts its KV cache.
- ``all-checks``: every check: the canary, partial real data, the radix sweep (every
  :data:`SWEEP_INTERVAL` steps), the token oracle (``--sampling-backend token_oracle``), the
  verify-token and the write-input asserts.

A configuration is its server environment (over a clean one: the shell's canary variables never
reach a server) and the launch flags it adds; the host benchmark builds its canary configuration
from the same environment (``sglang.srt.kv_canary.config.parse_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sglang.srt.kv_canary.tools.environment import CANARY_ENV_PREFIX

CANARY_FLAGS: tuple[str, ...] = ("--disable-piecewise-cuda-graph",)
SWEEP_INTERVAL = 100
STOCK = "stock"  # the baseline of every ratio
FLAGS_BASELINE = "off+flags"  # the baseline of the canary configurations' own cost
_MODE = f"{CANARY_ENV_PREFIX}MODE"


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """One configuration: its name, what it stands for, the environment variables of its
    server and the ``launch_server`` flags it adds."""

    name: str
    summary: str
    env: Mapping[str, str]
    flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "flags", tuple(self.flags))

    @property
    def canary_on(self) -> bool:
        """Whether the canary runs (``SGLANG_KV_CANARY_MODE`` is set and not ``none``)."""
        return self.env.get(_MODE, "none") != "none"

    @property
    def plugin_loaded(self) -> bool:
        """Whether SGLang's plugin loader may load the plugin (not ``stock``)."""
        return self.env.get("SGLANG_PLUGINS") != "none"

    @property
    def canary_env(self) -> dict[str, str]:
        """The ``SGLANG_KV_CANARY_*`` variables of the configuration."""
        return {name: value for name, value in self.env.items()
                if name.startswith(CANARY_ENV_PREFIX)}

    def to_json(self) -> dict[str, object]:
        return {"summary": self.summary, "env": dict(self.env), "flags": list(self.flags)}


# An empty SGLANG_PLUGINS is no whitelist: every installed plugin loads (and a value in the
# shell that runs the benchmark cannot keep the plugin out of a configuration that needs it).
_PLUGIN_ON = {"SGLANG_PLUGINS": ""}
_CANARY = {**_PLUGIN_ON, _MODE: "log"}
_ALL_CHECKS = {
    **_CANARY,
    f"{CANARY_ENV_PREFIX}REAL_DATA": "partial",
    f"{CANARY_ENV_PREFIX}SWEEP_INTERVAL": str(SWEEP_INTERVAL),
    f"{CANARY_ENV_PREFIX}ENABLE_TOKEN_ORACLE": "1",
    f"{CANARY_ENV_PREFIX}ENABLE_VERIFY_TOKEN_ASSERT": "1",
    f"{CANARY_ENV_PREFIX}ENABLE_WRITE_INPUT_ASSERT": "1",
}

CONFIGS: dict[str, BenchConfig] = {config.name: config for config in (
    BenchConfig(name=STOCK, summary="SGLang without the plugin, its default flags",
                env={"SGLANG_PLUGINS": "none"}),
    BenchConfig(name="off", summary="the plugin loaded, no SGLANG_KV_CANARY_* set, SGLang's "
                                    "default flags", env=_PLUGIN_ON),
    BenchConfig(name=FLAGS_BASELINE, summary="off with the canary's flags (" + " ".join(
        CANARY_FLAGS) + ")", env=_PLUGIN_ON, flags=CANARY_FLAGS),
    BenchConfig(name="canary", summary="SGLANG_KV_CANARY_MODE=log, the canary's flags",
                env=_CANARY, flags=CANARY_FLAGS),
    BenchConfig(name="all-checks", summary=(
        f"every check: the canary, REAL_DATA=partial, SWEEP_INTERVAL={SWEEP_INTERVAL}, the "
        "token oracle, the verify-token and write-input asserts; the canary's flags and "
        "--sampling-backend token_oracle"),
        env=_ALL_CHECKS, flags=(*CANARY_FLAGS, "--sampling-backend", "token_oracle")),
)}
CANARY_CONFIGS: tuple[str, ...] = tuple(name for name, config in CONFIGS.items()
                                        if config.canary_on)

