"""The dummy-weight model shapes the server benchmark serves, their server flags and targets.

``tiny``: a 4-layer Llama (hidden 256), where a forward takes about a millisecond, so the cost
of anything done per forward shows; ``8b``: the shape of Qwen3-8B (36 layers, hidden 4096, 32
heads, 8 KV heads, MLP 12288, vocabulary 151936), the deployment-sized case; ``tiny-swa``: a
4-layer GPT-OSS (hidden 256, MoE, layers alternating a 128-token sliding window and full
attention), which SGLang serves on its hybrid sliding-window pool (``SWAKVPool``,
``SWARadixCache``). ``tiny`` and ``8b`` are written by
:func:`sglang.srt.kv_canary.tools.tiny_model.make_tiny_model`, ``tiny-swa`` by
:func:`~sglang.srt.kv_canary.tools.tiny_model.make_tiny_gpt_oss` (:func:`make_model`); all are
served with ``--load-format dummy``. Every server of a run serves its model with
:attr:`ModelShape.server_args`: a KV pool capped so that it holds :data:`KV_POOL_TOKENS` (the
largest workload holds about 33k tokens), so every configuration's server fits one GPU beside
the others. A hybrid model's cap is :data:`HYBRID_FULL_POOL_TOKENS`: SGLang sizes its
sliding-window layers' pool at :data:`SWA_FULL_TOKENS_RATIO` of the full-attention layers' pool,
and that one then holds :data:`KV_POOL_TOKENS` too.

:data:`DEFAULT_MODELS` are what a run measures unless ``--models`` says otherwise.
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass

from sglang.srt.kv_canary.tools.tiny_model import (
    GPT_OSS_HEAD_DIM,
    make_tiny_gpt_oss,
    make_tiny_model,
)

from .targets import Target
from .workloads import WORKLOADS

CONTEXT_LENGTH = 4096
KV_POOL_TOKENS = 36864
GPT_OSS = "gpt_oss"  # the architecture make_tiny_gpt_oss writes; every other is make_tiny_model's
SWA_FULL_TOKENS_RATIO = 0.8  # SGLang 0.5.12's default --swa-full-tokens-ratio
# The full-attention pool of a hybrid model whose sliding-window pool holds KV_POOL_TOKENS: the
# sliding-window pool never limits a batch before the full pool does.
HYBRID_FULL_POOL_TOKENS = math.ceil(KV_POOL_TOKENS / SWA_FULL_TOKENS_RATIO)
_BF16_BYTES = 2


def _pool_args(*, max_total_tokens: int) -> tuple[str, ...]:
    return ("--load-format", "dummy", "--context-length", str(CONTEXT_LENGTH),
            "--max-total-tokens", str(max_total_tokens))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A dummy-weight model, how its servers are launched, what its run may take, and its
    targets.

    Two layouts, told apart by ``sliding_window``:

    - None: a llama-like model (``llama``, ``qwen3``: :func:`make_tiny_model`): head_dim =
      hidden / heads, MLP = 3 x hidden, every layer attends to the whole context;
    - a window: a GPT-OSS (``architecture`` :data:`GPT_OSS`, :func:`make_tiny_gpt_oss`): head_dim
      :data:`GPT_OSS_HEAD_DIM`, MoE, even layers attend to the last ``sliding_window`` tokens
      (the HF window, which counts the current token), odd layers to the whole context. SGLang
      keeps the two kinds of layer in separate pools (``SWAKVPool``).

    Attributes:
        server_args: the flags every server of this model gets (the pool, the load format, what
            the architecture needs on the GPU host).
        startup_estimate_s: launch to ready on a fresh machine, every server starting at once.
        time_share: its part of the measuring time left once every server is ready (the run
            splits that time over its models in proportion).
        targets: what the every-check configuration must reach against stock, and that canary
            off costs nothing.

    Raises:
        ValueError: ``sliding_window`` given for an architecture other than :data:`GPT_OSS`,
            or missing for it.
    """

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    sliding_window: int | None = None
    server_args: tuple[str, ...]
    startup_estimate_s: float
    time_share: float
    targets: tuple[Target, ...]

    def __post_init__(self) -> None:
        if (self.architecture == GPT_OSS) != self.hybrid_swa:
            raise ValueError(f"model {self.name!r}: sliding_window={self.sliding_window!r} is "
                             f"invalid for architecture {self.architecture!r}; allowed: a window "
                             f"for {GPT_OSS}, None for every other architecture")

    @property
    def hybrid_swa(self) -> bool:
        """Whether SGLang serves it on its hybrid sliding-window pool."""
        return self.sliding_window is not None

    @property
    def head_dim(self) -> int:
        """The width of one attention head (what the writer of the layout gives it)."""
        return GPT_OSS_HEAD_DIM if self.hybrid_swa else self.hidden_size // self.num_attention_heads

    @property
    def sliding_window_layers(self) -> int:
        """Layers that attend to a window (the even ones of a hybrid model; 0 otherwise)."""
        return (self.num_layers + 1) // 2 if self.hybrid_swa else 0

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers - self.sliding_window_layers

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V in bf16 of every full-attention layer: the bytes of one token of SGLang's KV
        pool (of a hybrid model, its full-attention pool)."""
        return self.full_attention_layers * self._kv_bytes_per_layer_token

    @property
    def swa_kv_bytes_per_token(self) -> int:
        """K and V in bf16 of every sliding-window layer: the bytes of one token of a hybrid
        model's sliding-window pool (0 for a model without one)."""
        return self.sliding_window_layers * self._kv_bytes_per_layer_token

    @property
    def _kv_bytes_per_layer_token(self) -> int:
        return self.num_key_value_heads * self.head_dim * 2 * _BF16_BYTES

    def describe(self) -> str:
        heads = f"{self.num_attention_heads}/{self.num_key_value_heads} heads"
        if not self.hybrid_swa:
            return (f"{self.architecture}, {self.num_layers} layers, hidden {self.hidden_size}, "
                    f"{heads}, vocabulary {self.vocab_size}, dummy weights, "
                    f"{self.kv_bytes_per_token / 1024:g} KiB of KV per token")
        return (f"{self.architecture} (MoE), {self.num_layers} layers: "
                f"{self.sliding_window_layers} sliding-window ({self.sliding_window} tokens), "
                f"{self.full_attention_layers} full attention; hidden {self.hidden_size}, {heads} "
                f"of {self.head_dim}, vocabulary {self.vocab_size}, dummy weights; KV per token "
                f"{self.kv_bytes_per_token / 1024:g} KiB in the full-attention pool, "
                f"{self.swa_kv_bytes_per_token / 1024:g} KiB in the sliding-window pool")

    def to_json(self) -> dict[str, object]:
        return {"architecture": self.architecture, "num_layers": self.num_layers,
                "hidden_size": self.hidden_size,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
                "vocab_size": self.vocab_size, "sliding_window": self.sliding_window,
                "sliding_window_layers": self.sliding_window_layers,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "swa_kv_bytes_per_token": self.swa_kv_bytes_per_token,
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
               server_args=(*_pool_args(max_total_tokens=KV_POOL_TOKENS),
                            "--mem-fraction-static", "0.3"),
               startup_estimate_s=110.0, time_share=0.35,
               targets=_targets(decode1=0.95, decode64=0.97)),
    ModelShape(name="8b", architecture="qwen3", num_layers=36, hidden_size=4096,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=151936,
               server_args=(*_pool_args(max_total_tokens=KV_POOL_TOKENS),
                            "--mem-fraction-static", "0.8"),
               startup_estimate_s=200.0, time_share=0.65,
               targets=_targets(decode1=0.985, decode64=0.985)),
    # The unquantized experts run on SGLang's own Triton fused MoE (every configuration, stock
    # included): the default runner needs the triton_kernels package, which the GPU host's
    # SGLang bundle lacks. Its start-up estimate is tiny's (a model of the same size).
    ModelShape(name="tiny-swa", architecture=GPT_OSS, num_layers=4, hidden_size=256,
               num_attention_heads=8, num_key_value_heads=4, vocab_size=4096,
               sliding_window=128,
               server_args=(*_pool_args(max_total_tokens=HYBRID_FULL_POOL_TOKENS),
                            "--mem-fraction-static", "0.3", "--moe-runner-backend", "triton"),
               startup_estimate_s=110.0, time_share=0.35,
               targets=_targets(decode1=0.95, decode64=0.97)),
)}
# tiny-swa is opt-in (--models tiny-swa): a third model's servers starting beside the other
# two's would slow every start-up and leave each model a third less measuring time within the
# default --time-budget-s.
DEFAULT_MODELS: tuple[str, ...] = ("tiny", "8b")


def make_model(model: ModelShape, *, directory: pathlib.Path) -> pathlib.Path:
    """Write ``model``'s directory (config and tokenizer, no weights) under ``directory``, with
    the writer of its layout; returns the directory, resolved."""
    if model.sliding_window is not None:
        return make_tiny_gpt_oss(
            directory=directory, num_layers=model.num_layers, hidden_size=model.hidden_size,
            num_attention_heads=model.num_attention_heads,
            num_key_value_heads=model.num_key_value_heads, sliding_window=model.sliding_window,
            vocab_size=model.vocab_size, max_position_embeddings=CONTEXT_LENGTH,
        )
    return make_tiny_model(
        directory=directory, architecture=model.architecture, num_layers=model.num_layers,
        hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads, vocab_size=model.vocab_size,
        max_position_embeddings=CONTEXT_LENGTH,
    )
