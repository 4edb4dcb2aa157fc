"""The dummy-weight model shapes the server benchmark serves, their server flags and targets.

``tiny``: a 4-layer Llama (hidden 256), where a forward takes about a millisecond, so the cost
of anything done per forward shows; ``8b``: the shape of Qwen3-8B (36 layers, hidden 4096, 32
heads, 8 KV heads, MLP 12288, vocabulary 151936), the deployment-sized case. Both are written by
:func:`sglang.srt.kv_canary.tools.tiny_model.make_tiny_model` and served with
``--load-format dummy``. Every server of a run serves its model with :attr:`ModelShape.server_args`:
a KV pool capped at :data:`KV_POOL_TOKENS` (the largest workload holds about 33k tokens), so
every configuration's server fits one GPU beside the others.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from sglang.srt.kv_canary.tools.tiny_model import make_tiny_model

from .targets import Target
from .workloads import WORKLOADS

CONTEXT_LENGTH = 4096
KV_POOL_TOKENS = 36864
_POOL_ARGS = ("--load-format", "dummy", "--context-length", str(CONTEXT_LENGTH),
              "--max-total-tokens", str(KV_POOL_TOKENS))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A dummy-weight model (head_dim = hidden / heads, MLP = 3 x hidden), how its servers are
    launched, what its run may take, and its targets.

    Attributes:
        server_args: the flags every server of this model gets (the pool, the load format).
        startup_estimate_s: launch to ready on a fresh machine, every server starting at once.
        time_share: its part of the measuring time left once every server is ready (the run
            splits that time over its models in proportion).
        targets: what the every-check configuration must reach against stock, and that canary
            off costs nothing.
    """

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    server_args: tuple[str, ...]
    startup_estimate_s: float
    time_share: float
    targets: tuple[Target, ...]

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer in bf16."""
        head_dim = self.hidden_size // self.num_attention_heads
        return self.num_layers * self.num_key_value_heads * head_dim * 2 * 2

    def describe(self) -> str:
        return (f"{self.architecture}, {self.num_layers} layers, hidden {self.hidden_size}, "
                f"{self.num_attention_heads}/{self.num_key_value_heads} heads, vocabulary "
                f"{self.vocab_size}, dummy weights, {self.kv_bytes_per_token / 1024:g} KiB of "
                "KV per token")

    def to_json(self) -> dict[str, object]:
        return {"architecture": self.architecture, "num_layers": self.num_layers,
                "hidden_size": self.hidden_size,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads, "vocab_size": self.vocab_size,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "server_args": list(self.server_args)}


def _targets(*, decode1: float, decode64: float) -> tuple[Target, ...]:
    """Every check: TTFT <= 1.05x at batch 1 and at 64 concurrent prompts, decode throughput
    at batch 1 and 64 at least the bounds; canary off: 1.000x on every workload."""
    every_check = (
        Target(config="all-checks", workload="ttft1", bound=1.05, kind="at_most"),
        Target(config="all-checks", workload="ttft64", bound=1.05, kind="at_most"),
        Target(config="all-checks", workload="decode1", bound=decode1, kind="at_least"),
        Target(config="all-checks", workload="decode64", bound=decode64, kind="at_least"),
    )
    off = tuple(Target(config="off", workload=name, bound=1.0, kind="no_cost")
                for name in WORKLOADS)
    return every_check + off


MODELS: dict[str, ModelShape] = {model.name: model for model in (
    ModelShape(name="tiny", architecture="llama", num_layers=4, hidden_size=256,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
               server_args=(*_POOL_ARGS, "--mem-fraction-static", "0.3"),
               startup_estimate_s=110.0, time_share=0.35,
               targets=_targets(decode1=0.95, decode64=0.97)),
    ModelShape(name="8b", architecture="qwen3", num_layers=36, hidden_size=4096,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=151936,
               server_args=(*_POOL_ARGS, "--mem-fraction-static", "0.8"),
               startup_estimate_s=200.0, time_share=0.65,
               targets=_targets(decode1=0.985, decode64=0.985)),
)}


def make_model(model: ModelShape, *, directory: pathlib.Path) -> pathlib.Path:
    """Write ``model``'s directory (config and tokenizer, no weights) under ``directory``."""
    return make_tiny_model(
        directory=directory, architecture=model.architecture, num_layers=model.num_layers,
        hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads, vocab_size=model.vocab_size,
        max_position_embeddings=CONTEXT_LENGTH,
    )
