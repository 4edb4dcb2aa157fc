"""The tiny GPT-OSS directory for SGLang's hybrid sliding-window KV pool: transformers reads it as
GptOssConfig, SGLang's ModelConfig reports a hybrid SWA model with the alternating layer ids and
attention sinks, and (in a child process on SGLang's CPU engine) GptOssForCausalLM is built from
it with dummy weights, unquantized, with the expected sliding window on the expected layers."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from sglang.srt.kv_canary.tools.tiny_model import (
    GPT_OSS_ARCHITECTURE,
    GPT_OSS_MAX_POSITIONS,
    TOKENIZER_FILES,
    main,
    make_tiny_gpt_oss,
    make_tiny_model,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="kv-canary-cpu")

_FILES = {"config.json", "generation_config.json", *TOKENIZER_FILES}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> pathlib.Path:
    return make_tiny_gpt_oss(directory=tmp_path_factory.mktemp("gpt_oss"))


def _config(directory: pathlib.Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def _model_config(directory: pathlib.Path, **kwargs):
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig(model_path=str(directory), **kwargs)


def test_directory_holds_an_unquantized_alternating_gpt_oss_config(model_dir) -> None:
    assert {p.name for p in model_dir.iterdir()} == _FILES
    config = _config(model_dir)
    assert config["architectures"] == [GPT_OSS_ARCHITECTURE] and config["model_type"] == "gpt_oss"
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (4, 256, 8, 4, 64)
    assert (config["num_local_experts"], config["num_experts_per_tok"],
            config["intermediate_size"]) == (4, 2, 256)
    assert config["sliding_window"] == 128 and config["max_position_embeddings"] == 4096
    assert config["vocab_size"] == 4096 and config["swiglu_limit"] == 7.0
    assert config["rope_scaling"]["rope_type"] == "yarn"


def test_tokenizer_matches_the_tiny_llama(model_dir, tmp_path) -> None:
    llama = make_tiny_model(directory=tmp_path)
    for name in TOKENIZER_FILES:
        assert (model_dir / name).read_bytes() == (llama / name).read_bytes(), name
    assert (model_dir / "generation_config.json").read_bytes() == \
        (llama / "generation_config.json").read_bytes()


def test_transformers_reads_a_gpt_oss_config(model_dir, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    assert type(config).__name__ == "GptOssConfig"
    # SGLang's GptOssDecoderLayer reads rope_parameters["rope_theta"] and passes the whole dict
    # to get_rope as the scaling.
    assert config.rope_parameters["rope_theta"] == 150000.0
    assert config.rope_parameters["rope_type"] == "yarn"
    assert (config.num_local_experts, config.num_experts_per_tok, config.swiglu_limit) == (4, 2, 7.0)


def test_sglang_model_config_sees_a_hybrid_swa_model(model_dir, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sglang.srt.models.gpt_oss import get_attention_sliding_window_size
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    model_config = _model_config(model_dir)
    assert model_config.is_hybrid_swa and model_config.has_attention_sinks
    assert model_config.swa_attention_layer_ids == [0, 2]
    assert model_config.full_attention_layer_ids == [1, 3]
    assert model_config.sliding_window_size == 128  # the raw HF value
    # What ModelRunner.sliding_window_size becomes: the model's window, exclusive of the token.
    assert get_attention_sliding_window_size(model_config.hf_config) == 127
    assert model_config.quantization is None
    assert (model_config.context_len, model_config.vocab_size, model_config.head_dim,
            model_config.get_num_kv_heads(1), model_config.get_swa_num_kv_heads(1)) == \
        (4096, 4096, 64, 4, 4)
    assert len(get_tokenizer(str(model_dir))) == model_config.vocab_size
    assert not _model_config(model_dir, disable_hybrid_swa_memory=True).is_hybrid_swa


def test_other_sizes_keep_the_alternation(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sglang.srt.models.gpt_oss import get_attention_sliding_window_size

    directory = make_tiny_gpt_oss(directory=tmp_path, num_layers=5, sliding_window=64,
                                  num_attention_heads=4, num_key_value_heads=1)
    model_config = _model_config(directory)
    assert model_config.swa_attention_layer_ids == [0, 2, 4]
    assert model_config.full_attention_layer_ids == [1, 3]
    assert get_attention_sliding_window_size(model_config.hf_config) == 63


# Builds the model the way SGLang's model runner does for --load-format dummy, on SGLang's CPU
# engine (SGLANG_USE_CPU_ENGINE is read at import time, hence the child process; so is the
# process-global distributed state).
_CHILD = r"""
import json, sys
model_dir, init_file = sys.argv[1], sys.argv[2]
from sglang.srt.configs.device_config import DeviceConfig
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.layers.dp_attention import initialize_dp_attention
from sglang.srt.layers.moe import initialize_moe_config
from sglang.srt.model_loader.loader import get_model_loader
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

server_args = ServerArgs(model_path=model_dir, device="cpu", load_format="dummy",
                         attention_backend="triton", moe_runner_backend="triton")
set_global_server_args_for_scheduler(server_args)
model_config = ModelConfig.from_server_args(server_args)
init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method="file://" + init_file)
initialize_model_parallel(1, 1)
initialize_dp_attention(server_args=server_args, model_config=model_config)
initialize_moe_config(server_args)
model = get_model_loader(LoadConfig(load_format="dummy"), model_config).load_model(
    model_config=model_config, device_config=DeviceConfig("cpu"))
layers = model.model.layers
print(json.dumps({
    "class": type(model).__name__,
    "window": model.get_attention_sliding_window_size(),
    "layer_windows": [layer.self_attn.attn.sliding_window_size for layer in layers],
    "moe": [type(layer.mlp.experts.quant_method).__name__ for layer in layers],
    "dtypes": sorted({str(p.dtype) for n, p in model.named_parameters() if "bias" not in n}),
    "shapes": {n: list(p.shape) for n, p in model.named_parameters() if n.startswith("model.layers.1.")},
    "kv_heads": layers[0].self_attn.attn.tp_k_head_num,
}))
"""


def test_sglang_builds_the_model_with_dummy_weights(model_dir, tmp_path) -> None:
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"}
    child = subprocess.run([sys.executable, "-c", _CHILD, str(model_dir), str(tmp_path / "init")],
                           env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-4000:]
    built = json.loads(child.stdout.strip().splitlines()[-1])
    assert built["class"] == GPT_OSS_ARCHITECTURE and built["window"] == 127
    assert built["layer_windows"] == [127, -1, 127, -1]  # -1: full attention
    assert built["moe"] == ["UnquantizedFusedMoEMethod"] * 4
    assert built["dtypes"] == ["torch.bfloat16"] and built["kv_heads"] == 4
    shapes = built["shapes"]
    prefix = "model.layers.1."
    assert shapes[prefix + "self_attn.sinks"] == [8]
    assert shapes[prefix + "self_attn.qkv_proj.weight"] == [(8 + 2 * 4) * 64, 256]
    assert shapes[prefix + "mlp.router.weight"] == [4, 256]
    assert shapes[prefix + "mlp.experts.w13_weight"] == [4, 2 * 256, 256]
    assert shapes[prefix + "mlp.experts.w2_weight"] == [4, 256, 256]


def test_deterministic(model_dir, tmp_path) -> None:
    again = make_tiny_gpt_oss(directory=tmp_path)
    for name in _FILES:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


@pytest.mark.parametrize(
    "arguments,fragment",
    [
        ({"num_layers": 1}, "num_layers=1 is invalid; allowed: an integer >= 2"),
        ({"num_layers": 0}, "num_layers=0"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3 is invalid"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok=5 is invalid; allowed: at most "
                                     "num_local_experts=4"),
        ({"sliding_window": 1}, "sliding_window=1 is invalid; allowed: an integer in [2, "),
        ({"sliding_window": 5000}, "sliding_window=5000 is invalid"),
        ({"max_position_embeddings": GPT_OSS_MAX_POSITIONS + 1},
         f"max_position_embeddings={GPT_OSS_MAX_POSITIONS + 1} is invalid"),
        ({"vocab_size": 100}, "vocab_size=100 is invalid"),
        ({"intermediate_size": 0}, "intermediate_size=0"),
    ],
)
def test_invalid_arguments_name_themselves(tmp_path, arguments, fragment) -> None:
    with pytest.raises(ValueError) as error:
        make_tiny_gpt_oss(directory=tmp_path, **arguments)
    assert fragment in str(error.value)


def test_command_line_writes_gpt_oss(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "m"), "--architecture", "gpt_oss", "--num-layers", "2",
                 "--sliding-window", "32"]) == 0
    config = _config(tmp_path / "m")
    assert config["architectures"] == [GPT_OSS_ARCHITECTURE]
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert (config["sliding_window"], config["num_attention_heads"],
            config["num_key_value_heads"]) == (32, 8, 4)
    assert "tiny gpt_oss model:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x"), "--architecture", "gpt_oss", "--draft", str(tmp_path / "d")])
    assert "--draft is for llama and qwen3 targets only" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
