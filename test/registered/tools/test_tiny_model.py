"""The tiny offline model directory: valid for transformers and for SGLang's own config and
tokenizer loaders, deterministic, exact vocabulary, fast; and its EAGLE draft."""

import json
import pathlib
import sys
import time

import pytest

from sglang.srt.kv_canary.tools.tiny_model import (
    EAGLE_DRAFT_ARCHITECTURE,
    FIRST_ORDINARY_TOKEN_ID,
    MAX_VOCAB_SIZE,
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    main,
    make_tiny_deepseek_v2,
    make_tiny_eagle_draft,
    make_tiny_model,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="kv-canary-cpu")

_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> pathlib.Path:
    return make_tiny_model(directory=tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory, model_dir) -> pathlib.Path:
    return make_tiny_eagle_draft(directory=tmp_path_factory.mktemp("draft"), target_dir=model_dir)


def _config(directory: pathlib.Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_directory_holds_config_and_tokenizer_only(model_dir) -> None:
    assert {p.name for p in model_dir.iterdir()} == _FILES
    config = _config(model_dir)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (4, 256, 4, 2, 64)
    assert config["vocab_size"] == 4096 and config["max_position_embeddings"] == 4096
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 2)


def test_transformers_loads_the_tokenizer_offline_with_the_model_vocabulary(model_dir,
                                                                            monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    assert len(tokenizer) == _config(model_dir)["vocab_size"] == 4096
    assert tokenizer.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS)))) == list(SPECIAL_TOKENS)
    text = "the key value cache of layer 7 holds 1234 tokens, zebu!"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id == 0
    assert all(0 <= i < 4096 for i in ids) and len(ids) < len(text)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.eos_token_id == 1 and tokenizer.pad_token_id == 2
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True).endswith("assistant\n")


def test_sglang_accepts_target_and_draft(model_dir, draft_dir, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    target = ModelConfig(model_path=str(model_dir))
    draft = ModelConfig(model_path=str(draft_dir), is_draft_model=True)
    assert target.hf_config.architectures == ["LlamaForCausalLM"]
    assert draft.hf_config.architectures == [EAGLE_DRAFT_ARCHITECTURE]
    assert (draft.num_hidden_layers, draft.vocab_size, draft.context_len) == (1, 4096, 4096)
    assert draft.hf_config.hidden_size == target.hf_config.hidden_size
    assert len(get_tokenizer(str(model_dir))) == target.vocab_size


def test_draft_matches_its_target(model_dir, draft_dir) -> None:
    target, draft = _config(model_dir), _config(draft_dir)
    assert draft["architectures"] == [EAGLE_DRAFT_ARCHITECTURE] and draft["num_hidden_layers"] == 1
    for key in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "max_position_embeddings", "eos_token_id"):
        assert draft[key] == target[key], key
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (draft_dir / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_deterministic_and_fast(tmp_path) -> None:
    started = time.monotonic()
    first = make_tiny_model(directory=tmp_path / "a")
    assert time.monotonic() - started < 10
    second = make_tiny_model(directory=tmp_path / "b")
    for name in _FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


@pytest.mark.parametrize("vocab_size", [MIN_VOCAB_SIZE, 1000, 32000, MAX_VOCAB_SIZE])
def test_vocabulary_size_is_exact(tmp_path, vocab_size) -> None:
    from tokenizers import Tokenizer

    directory = make_tiny_model(directory=tmp_path, vocab_size=vocab_size)
    assert Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab_size() == vocab_size
    assert _config(directory)["vocab_size"] == vocab_size
    assert FIRST_ORDINARY_TOKEN_ID == len(SPECIAL_TOKENS)


def test_qwen3_variant(tmp_path) -> None:
    config = _config(make_tiny_model(directory=tmp_path, architecture="qwen3", num_layers=2))
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["max_window_layers"] == 2 and config["use_sliding_window"] is False


def test_the_deepseek_v2_variant_is_an_mla_model_to_sglang(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    directory = make_tiny_deepseek_v2(directory=tmp_path)
    config = ModelConfig(model_path=str(directory))
    assert config.hf_config.architectures == ["DeepseekV2ForCausalLM"]
    assert config.attention_arch == AttentionArch.MLA
    assert (config.kv_lora_rank, config.qk_rope_head_dim, config.num_hidden_layers) == (512, 64, 3)
    # dense MLPs only: no layer reaches the experts
    assert config.hf_config.first_k_dense_replace == config.num_hidden_layers
    with pytest.raises(ValueError, match="hidden_size=250"):
        make_tiny_deepseek_v2(directory=tmp_path / "bad", hidden_size=250)


@pytest.mark.parametrize(
    "arguments,fragment",
    [
        ({"architecture": "gpt2"}, "architecture='gpt2' is invalid; allowed: llama, qwen3"),
        ({"num_layers": 0}, "num_layers=0"),
        ({"hidden_size": 250}, "hidden_size=250"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
        ({"vocab_size": 100},
         f"vocab_size=100 is invalid; allowed: an integer in [{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE}]"),
        ({"vocab_size": MAX_VOCAB_SIZE + 1}, f"vocab_size={MAX_VOCAB_SIZE + 1} is invalid"),
    ],
)
def test_invalid_arguments_name_themselves(tmp_path, arguments, fragment) -> None:
    with pytest.raises(ValueError) as error:
        make_tiny_model(directory=tmp_path, **arguments)
    assert fragment in str(error.value)


def test_command_line_writes_target_and_draft(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "m"), "--draft", str(tmp_path / "d"), "--num-layers", "2"]) == 0
    assert _config(tmp_path / "m")["num_hidden_layers"] == 2
    assert _config(tmp_path / "d")["architectures"] == [EAGLE_DRAFT_ARCHITECTURE]
    assert "EAGLE draft model:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x"), "--vocab-size", "10"])
    assert "vocab_size=10 is invalid" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
