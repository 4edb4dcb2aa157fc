"""A tiny, weightless model directory that SGLang serves offline with ``--load-format dummy``.

The directory holds ``config.json``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json`` and ``special_tokens_map.json``; no weights. The tokenizer is a
byte-level BPE whose vocabulary is built, not trained: the special tokens, the 256 byte symbols,
then merges that spell out a fixed list of words and seeded pseudo-words until the vocabulary
has exactly ``vocab_size`` entries. Everything is deterministic (same arguments, same bytes)
and takes well under a second.

:func:`make_tiny_eagle_draft` writes an EAGLE draft (``LlamaForCausalLMEagle``, one decoder
layer) whose hidden size, vocabulary and context length match a target directory, for
``--speculative-algorithm EAGLE --speculative-draft-model-path``.

:func:`make_tiny_gpt_oss` writes an unquantized ``GptOssForCausalLM`` (MoE, attention sinks,
layers alternating sliding-window / full attention) with the same tokenizer, which SGLang serves
on its hybrid sliding-window KV pool (``SWAKVPool``, ``SWATokenToKVPoolAllocator``,
``SWARadixCache``).

:func:`make_tiny_deepseek_v2` writes a ``DeepseekV2ForCausalLM`` with DeepSeek-V2's multi-head
latent attention (the latent and RoPE widths of DeepSeek V2/V3) and dense MLPs, which SGLang
serves on its ``MLATokenToKVPool``.

CLI: ``python -m sglang.srt.kv_canary.tools.tiny_model DIR [--draft DRAFT_DIR] [--architecture
llama|qwen3|gpt_oss|deepseek_v2] [--num-layers N] [--sliding-window W] ...`` (``--draft`` with
llama and qwen3 only).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import shutil
from collections.abc import Iterator, Sequence

TARGET_ARCHITECTURES: dict[str, str] = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
EAGLE_DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle"
GPT_OSS_ARCHITECTURE = "GptOssForCausalLM"
GPT_OSS_HEAD_DIM = 64  # openai/gpt-oss-20b's; one of the sizes SGLang's CUDA RoPE kernel takes
# The RoPE of openai/gpt-oss-20b, verbatim: its YaRN cache covers 4096 * 32 positions.
GPT_OSS_ROPE_THETA = 150000.0
GPT_OSS_ROPE_SCALING: dict[str, object] = {
    "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
    "truncate": False, "original_max_position_embeddings": 4096,
}
GPT_OSS_MAX_POSITIONS = 4096 * 32
GPT_OSS_SWIGLU_LIMIT = 7.0
DEEPSEEK_V2_ARCHITECTURE = "DeepseekV2ForCausalLM"
# DeepSeek V2/V3's MLA widths: the shapes SGLang's MLA kernels are built and tested for.
DEEPSEEK_KV_LORA_RANK = 512
DEEPSEEK_QK_ROPE_HEAD_DIM = 64
DEEPSEEK_QK_NOPE_HEAD_DIM = 128
DEEPSEEK_V_HEAD_DIM = 128

BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, "<|im_start|>", "<|im_end|>")
FIRST_ORDINARY_TOKEN_ID = len(SPECIAL_TOKENS)  # ids below this are special tokens
_BYTE_SYMBOLS = 256
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + _BYTE_SYMBOLS + 1
MAX_VOCAB_SIZE = 262_144

TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
)
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the of and to in is that for it as was with be by on not this are or from at which but "
    "have an they you were there been one all we their has would when if so no will cache key "
    "value page token layer head block model server request batch decode prefill attention "
    "memory corruption detector checksum tensor kernel triton sglang llama canary radix slot "
    "chain position prefix sweep oracle graph replay draft verify"
).split()
_SYLLABLES = tuple(c + v for c in "bdfghklmnprstvwz" for v in "aeiou")
_WORD_SEED = 20240521
_PSEUDO_WORDS = 100_000


def _word_stream() -> Iterator[str]:
    """The words whose spellings become merges, in merge order (deterministic); the stream
    spells out more than :data:`MAX_VOCAB_SIZE` merges."""
    yield from _WORDS
    yield from (str(number) for number in range(100))
    rng = random.Random(_WORD_SEED)
    for _ in range(_PSEUDO_WORDS):
        yield "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))


def _bpe_vocab_and_merges(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary of exactly ``vocab_size`` entries and its merges."""
    from tokenizers import pre_tokenizers

    vocab: dict[str, int] = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in _word_stream():
        for spelling in ("\u0120" + word, word):  # "Ġ" is the byte-level symbol of a space
            piece = spelling[0]
            for symbol in spelling[1:]:
                if len(vocab) == vocab_size:
                    return vocab, merges
                merged = piece + symbol
                if merged not in vocab:
                    merges.append((piece, symbol))
                    vocab[merged] = len(vocab)
                piece = merged
    raise RuntimeError(f"the word stream cannot fill a vocabulary of {vocab_size}")


def _write_tokenizer(*, directory: pathlib.Path, vocab_size: int, max_length: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = _bpe_vocab_and_merges(vocab_size)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"the tokenizer has {tokenizer.get_vocab_size()} entries, "
                           f"not {vocab_size}")
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN,
        "add_bos_token": True, "model_max_length": max_length,
        "clean_up_tokenization_spaces": False, "chat_template": _CHAT_TEMPLATE,
    })
    _write_json(directory / "special_tokens_map.json",
                {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN})


def _write_json(path: pathlib.Path, content: dict[str, object]) -> None:
    path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _write_model_config(root: pathlib.Path, config: dict[str, object]) -> None:
    """``config.json`` and a greedy ``generation_config.json`` with the special token ids."""
    _write_json(root / "config.json", config)
    _write_json(root / "generation_config.json", {**_special_ids(), "do_sample": False})


def _require_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid; allowed: an integer >= 1")


def _special_ids() -> dict[str, int]:
    return {
        "bos_token_id": SPECIAL_TOKENS.index(BOS_TOKEN),
        "eos_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "pad_token_id": SPECIAL_TOKENS.index(PAD_TOKEN),
    }


def make_tiny_model(
    *,
    directory: pathlib.Path | str,
    architecture: str = "llama",
    num_layers: int = 4,
    hidden_size: int = 256,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vocab_size: int = 4096,
    max_position_embeddings: int = 4096,
) -> pathlib.Path:
    """Write a tiny target model directory (created if missing; our files overwritten).

    Args:
        architecture: ``"llama"`` (LlamaForCausalLM) or ``"qwen3"`` (Qwen3ForCausalLM).
        hidden_size: a multiple of ``num_attention_heads``; head_dim = hidden / heads, the MLP
            is 3x hidden.
        num_key_value_heads: divides ``num_attention_heads`` (GQA).
        vocab_size: the exact size of both the tokenizer and the model vocabulary, in
            [:data:`MIN_VOCAB_SIZE`, :data:`MAX_VOCAB_SIZE`]. Ids below :data:`FIRST_ORDINARY_TOKEN_ID` are special tokens.

    Returns:
        The directory, resolved.

    Raises:
        ValueError: an argument is out of range (the message names it and what is allowed).
    """
    if architecture not in TARGET_ARCHITECTURES:
        raise ValueError(f"architecture={architecture!r} is invalid; allowed: "
                         + ", ".join(TARGET_ARCHITECTURES))
    _require_positive(num_layers=num_layers, hidden_size=hidden_size,
                      num_attention_heads=num_attention_heads,
                      num_key_value_heads=num_key_value_heads,
                      max_position_embeddings=max_position_embeddings)
    if hidden_size % num_attention_heads:
        raise ValueError(f"hidden_size={hidden_size} is invalid; allowed: a multiple of "
                         f"num_attention_heads={num_attention_heads}")
    _require_gqa(num_attention_heads=num_attention_heads,
                 num_key_value_heads=num_key_value_heads)
    root = _model_directory(directory=directory, vocab_size=vocab_size,
                            max_position_embeddings=max_position_embeddings)
    config: dict[str, object] = {
        "architectures": [TARGET_ARCHITECTURES[architecture]],
        "model_type": architecture,
        "hidden_size": hidden_size,
        "intermediate_size": 3 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": hidden_size // num_attention_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "initializer_range": 0.02,
        **_special_ids(),
    }
    if architecture == "qwen3":
        config.update({"use_sliding_window": False, "sliding_window": None,
                       "max_window_layers": num_layers})
    _write_model_config(root, config)
    return root


def make_tiny_eagle_draft(
    *, directory: pathlib.Path | str, target_dir: pathlib.Path | str
) -> pathlib.Path:
    """Write an EAGLE draft model directory for the tiny target model in ``target_dir``.

    The draft is ``LlamaForCausalLMEagle`` with one decoder layer and the target's hidden size,
    head layout, vocabulary and context length (SGLang shares the target's embedding and LM head
    with it). Serve with ``--speculative-algorithm EAGLE --speculative-draft-model-path
    <directory>`` and ``--load-format dummy`` (the draft loads with the same format).

    Raises:
        FileNotFoundError: ``target_dir`` has no ``config.json``.
    """
    source = pathlib.Path(target_dir).resolve()
    target = json.loads((source / "config.json").read_text(encoding="utf-8"))
    root = pathlib.Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, root / name)
    kept = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta",
            "vocab_size", "torch_dtype", "initializer_range", "bos_token_id", "eos_token_id",
            "pad_token_id")
    config = {key: target[key] for key in kept}
    config.update({"architectures": [EAGLE_DRAFT_ARCHITECTURE], "model_type": "llama",
                   "num_hidden_layers": 1, "tie_word_embeddings": False,
                   "attention_bias": False})
    _write_json(root / "config.json", config)
    shutil.copyfile(source / "generation_config.json", root / "generation_config.json")
    return root


def _require_gqa(*, num_attention_heads: int, num_key_value_heads: int) -> None:
    """Raise ``ValueError`` unless the KV heads divide the attention heads."""
    if num_attention_heads % num_key_value_heads:
        raise ValueError(f"num_key_value_heads={num_key_value_heads} is invalid; allowed: a "
                         f"divisor of num_attention_heads={num_attention_heads}")


def _model_directory(*, directory: pathlib.Path | str, vocab_size: int,
                     max_position_embeddings: int) -> pathlib.Path:
    """Check ``vocab_size``, create ``directory`` and write the tokenizer files into it.

    Raises:
        ValueError: ``vocab_size`` is outside [MIN_VOCAB_SIZE, MAX_VOCAB_SIZE].
    """
    if not isinstance(vocab_size, int) or not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size={vocab_size!r} is invalid; allowed: an integer in "
                         f"[{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE}]")
    root = pathlib.Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(directory=root, vocab_size=vocab_size, max_length=max_position_embeddings)
    return root


def make_tiny_gpt_oss(
    *,
    directory: pathlib.Path | str,
    num_layers: int = 4,
    hidden_size: int = 256,
    num_attention_heads: int = 8,
    num_key_value_heads: int = 4,
    num_local_experts: int = 4,
    num_experts_per_tok: int = 2,
    intermediate_size: int = 256,
    sliding_window: int = 128,
    vocab_size: int = 4096,
    max_position_embeddings: int = 4096,
) -> pathlib.Path:
    """Write a tiny unquantized GPT-OSS model directory (created if missing; our files
    overwritten), for SGLang's hybrid sliding-window KV pool.

    ``config.json`` is ``GptOssForCausalLM`` / ``gpt_oss`` in the layout of openai/gpt-oss-20b
    without its ``quantization_config``: bf16 everywhere, so the experts run unquantized (serve
    with ``--moe-runner-backend triton`` for SGLang's own triton fused MoE; ``auto`` picks the
    ``triton_kernels`` package where it is installed). Every layer is MoE with router and
    expert biases and SwiGLU clamped at :data:`GPT_OSS_SWIGLU_LIMIT`; attention has q/k/v/o
    biases, learned sinks, head_dim :data:`GPT_OSS_HEAD_DIM` and openai/gpt-oss-20b's YaRN RoPE.
    Layer ``i`` is ``"sliding_attention"`` for even ``i`` and ``"full_attention"`` for odd ``i``,
    so SGLang's ``ModelConfig`` reports ``is_hybrid_swa`` (unless ``--disable-hybrid-swa-memory``)
    with SWA layer ids ``[0, 2, ...]`` and full layer ids ``[1, 3, ...]``. The tokenizer files
    are those :func:`make_tiny_model` writes for the same ``vocab_size`` and
    ``max_position_embeddings``. Serve with ``--load-format dummy --attention-backend triton``.

    Args:
        num_layers: at least 2, so that both kinds of layer exist.
        hidden_size: the residual width (independent of heads x head_dim, as in GPT-OSS).
        num_key_value_heads: divides ``num_attention_heads`` (GQA).
        num_experts_per_tok: the router's top-k, at most ``num_local_experts``.
        intermediate_size: each expert's width (its gate_up projection is twice that).
        sliding_window: the HF window, which counts the current token: a query at position q
            attends to keys in [q - sliding_window + 1, q]. SGLang's
            ``get_attention_sliding_window_size`` (and so ``ModelRunner.sliding_window_size``)
            is ``sliding_window - 1``. At least 2, at most ``max_position_embeddings``.
        vocab_size: as for :func:`make_tiny_model`.
        max_position_embeddings: the context length SGLang derives, at most
            :data:`GPT_OSS_MAX_POSITIONS` (what the YaRN cache covers).

    Returns:
        The directory, resolved.

    Raises:
        ValueError: an argument is out of range (the message names it and what is allowed).
    """
    _require_positive(num_layers=num_layers, hidden_size=hidden_size,
                      num_attention_heads=num_attention_heads,
                      num_key_value_heads=num_key_value_heads,
                      num_local_experts=num_local_experts,
                      num_experts_per_tok=num_experts_per_tok,
                      intermediate_size=intermediate_size, sliding_window=sliding_window,
                      max_position_embeddings=max_position_embeddings)
    if num_layers < 2:
        raise ValueError(f"num_layers={num_layers} is invalid; allowed: an integer >= 2 (one "
                         "sliding-window and one full-attention layer at least)")
    _require_gqa(num_attention_heads=num_attention_heads,
                 num_key_value_heads=num_key_value_heads)
    if num_experts_per_tok > num_local_experts:
        raise ValueError(f"num_experts_per_tok={num_experts_per_tok} is invalid; allowed: at "
                         f"most num_local_experts={num_local_experts}")
    if max_position_embeddings > GPT_OSS_MAX_POSITIONS:
        raise ValueError(f"max_position_embeddings={max_position_embeddings} is invalid; "
                         f"allowed: at most {GPT_OSS_MAX_POSITIONS}")
    if not 2 <= sliding_window <= max_position_embeddings:
        raise ValueError(f"sliding_window={sliding_window} is invalid; allowed: an integer in "
                         f"[2, max_position_embeddings={max_position_embeddings}]")
    root = _model_directory(directory=directory, vocab_size=vocab_size,
                            max_position_embeddings=max_position_embeddings)
    config: dict[str, object] = {
        "architectures": [GPT_OSS_ARCHITECTURE],
        "model_type": "gpt_oss",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "layer_types": [("sliding_attention", "full_attention")[i % 2]
                        for i in range(num_layers)],
        "sliding_window": sliding_window,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": GPT_OSS_HEAD_DIM,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "num_local_experts": num_local_experts,
        "num_experts_per_tok": num_experts_per_tok,
        "swiglu_limit": GPT_OSS_SWIGLU_LIMIT,
        "router_aux_loss_coef": 0.9,
        "output_router_logits": False,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": GPT_OSS_ROPE_THETA,
        "rope_scaling": dict(GPT_OSS_ROPE_SCALING),
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
        **_special_ids(),
    }
    _write_model_config(root, config)
    return root


def make_tiny_deepseek_v2(
    *,
    directory: pathlib.Path | str,
    num_layers: int = 3,
    hidden_size: int = 256,
    num_attention_heads: int = 16,
    vocab_size: int = 4096,
    max_position_embeddings: int = 4096,
) -> pathlib.Path:
    """Write a tiny ``DeepseekV2ForCausalLM`` directory (created if missing; our files
    overwritten), for SGLang's MLA KV pool (``MLATokenToKVPool``).

    Attention is DeepSeek-V2's MLA with its real widths (latent
    :data:`DEEPSEEK_KV_LORA_RANK`, RoPE :data:`DEEPSEEK_QK_ROPE_HEAD_DIM`, no query LoRA, as in
    DeepSeek-V2-Lite): each token's KV is one row of 576 values per layer. Every layer's MLP is
    dense (``first_k_dense_replace`` = ``num_layers``, so no expert runs), RoPE is the default
    one. The tokenizer files are those :func:`make_tiny_model` writes. Serve with
    ``--load-format dummy --attention-backend triton`` (or ``flashinfer``).

    Args:
        hidden_size: a multiple of ``num_attention_heads`` (the config's own check).

    Returns:
        The directory, resolved.

    Raises:
        ValueError: an argument is out of range (the message names it and what is allowed).
    """
    _require_positive(num_layers=num_layers, hidden_size=hidden_size,
                      num_attention_heads=num_attention_heads,
                      max_position_embeddings=max_position_embeddings)
    if hidden_size % num_attention_heads:
        raise ValueError(f"hidden_size={hidden_size} is invalid; allowed: a multiple of "
                         f"num_attention_heads={num_attention_heads}")
    root = _model_directory(directory=directory, vocab_size=vocab_size,
                            max_position_embeddings=max_position_embeddings)
    config: dict[str, object] = {
        "architectures": [DEEPSEEK_V2_ARCHITECTURE],
        "model_type": "deepseek_v2",
        "hidden_size": hidden_size,
        "intermediate_size": 3 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_attention_heads,
        "q_lora_rank": None,
        "kv_lora_rank": DEEPSEEK_KV_LORA_RANK,
        "qk_rope_head_dim": DEEPSEEK_QK_ROPE_HEAD_DIM,
        "qk_nope_head_dim": DEEPSEEK_QK_NOPE_HEAD_DIM,
        "v_head_dim": DEEPSEEK_V_HEAD_DIM,
        # dense MLPs everywhere: the MoE fields are the model's, but no layer is sparse
        "first_k_dense_replace": num_layers,
        "moe_layer_freq": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": hidden_size,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "greedy",
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
        **_special_ids(),
    }
    _write_model_config(root, config)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang.srt.kv_canary.tools.tiny_model",
        description="Write a tiny weightless model directory (serve with --load-format dummy).",
    )
    parser.add_argument("directory", type=pathlib.Path, help="the target model directory")
    parser.add_argument("--draft", type=pathlib.Path, metavar="DRAFT_DIR",
                        help="also write an EAGLE draft model for it here")
    parser.add_argument("--architecture",
                        choices=sorted([*TARGET_ARCHITECTURES, "gpt_oss", "deepseek_v2"]),
                        default="llama")
    parser.add_argument("--num-layers", type=int, help="default: 3 (deepseek_v2) or 4")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-attention-heads", type=int,
                        help="default: 4 (llama, qwen3), 8 (gpt_oss) or 16 (deepseek_v2)")
    parser.add_argument("--num-key-value-heads", type=int,
                        help="default: 2 (llama, qwen3) or 4 (gpt_oss)")
    parser.add_argument("--sliding-window", type=int, default=128, help="gpt_oss only")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--max-position-embeddings", type=int, default=4096)
    options = parser.parse_args(argv)
    gpt_oss = options.architecture == "gpt_oss"
    deepseek = options.architecture == "deepseek_v2"
    if (gpt_oss or deepseek) and options.draft is not None:
        parser.error("--draft is for llama and qwen3 targets only")
    layers = options.num_layers
    layers = (3 if deepseek else 4) if layers is None else layers
    heads = options.num_attention_heads
    heads = (8 if gpt_oss else 4) if heads is None else heads
    kv_heads = options.num_key_value_heads
    kv_heads = (4 if gpt_oss else 2) if kv_heads is None else kv_heads
    try:
        if deepseek:
            target = make_tiny_deepseek_v2(
                directory=options.directory, num_layers=layers,
                hidden_size=options.hidden_size,
                num_attention_heads=options.num_attention_heads or 16,
                vocab_size=options.vocab_size,
                max_position_embeddings=options.max_position_embeddings,
            )
        elif gpt_oss:
            target = make_tiny_gpt_oss(
                directory=options.directory, num_layers=layers,
                hidden_size=options.hidden_size, num_attention_heads=heads,
                num_key_value_heads=kv_heads, sliding_window=options.sliding_window,
                vocab_size=options.vocab_size,
                max_position_embeddings=options.max_position_embeddings,
            )
        else:
            target = make_tiny_model(
                directory=options.directory, architecture=options.architecture,
                num_layers=layers, hidden_size=options.hidden_size,
                num_attention_heads=heads, num_key_value_heads=kv_heads,
                vocab_size=options.vocab_size,
                max_position_embeddings=options.max_position_embeddings,
            )
    except ValueError as exc:
        parser.error(str(exc))
    print(f"tiny {options.architecture} model: {target}")
    if options.draft is not None:
        draft = make_tiny_eagle_draft(directory=options.draft, target_dir=target)
        print(f"EAGLE draft model: {draft}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
