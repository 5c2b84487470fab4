"""Checkpoint discovery and loading (engine/checkpoint/folder.py, weights.py, checkpoint.py), and the errors users
see for bad checkpoints. Files confined to the folder: test_files.py."""

import json
import shutil

import pytest
import torch
from tests.helpers import FIXTURES, PARITY, copy_fixture, engine_for
from safetensors.torch import load_file, save_file

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.engine import LLMEngine
from dlm_backend.errors import (CheckpointError, ModelNotFoundError, UnknownArchitectureError,
                                UnsafeCheckpointError)


def test_unknown_architecture_lists_supported(tmp_path):
    ckpt = copy_fixture(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["MysteryForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnknownArchitectureError,
                       match="MysteryForCausalLM.*Supported: DiffusionGemmaForBlockDiffusion, DreamModel, .*LLaDAModelLM"):
        engine_for(ckpt)


def test_missing_tensor_is_named(tmp_path):
    ckpt = copy_fixture(tmp_path)
    state = load_file(str(ckpt / "model.safetensors"))
    del state["model.transformer.blocks.1.up_proj.weight"]
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing.*blocks\.1\.up_proj\.weight"):
        engine_for(ckpt)


def test_misshaped_tensor_is_named(tmp_path):
    ckpt = copy_fixture(tmp_path, "dream-tiny")
    state = load_file(str(ckpt / "model.safetensors"))
    state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"k_proj\.weight: expected \[32, 64\], found \[16, 64\]"):
        engine_for(ckpt)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    ckpt = copy_fixture(tmp_path)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(UnsafeCheckpointError, match="pickle.*never reads them"):
        engine_for(ckpt)


def test_missing_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        engine_for(tmp_path / "empty")


def test_missing_local_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        engine_for(tmp_path / "nope")


def test_hub_id_not_cached_while_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        engine_for("GSAI-ML/LLaDA-8B-Instruct")


def test_hub_id_loads_from_local_cache(tmp_path, monkeypatch):
    """A hub id resolves through huggingface_hub's cache layout (snapshots/<revision>)."""
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny-llada"
    snapshot = repo / "snapshots" / ("a" * 40)
    shutil.copytree(PARITY / "llada-tiny", snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    engine = LLMEngine(EngineConfig(model="org/tiny-llada"))
    assert engine.checkpoint.folder == snapshot


def test_sharded_checkpoint_loads_the_same(tmp_path):
    ckpt = copy_fixture(tmp_path)
    state = load_file(str(ckpt / "model.safetensors"))
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(ckpt / file))
    (ckpt / "model.safetensors").unlink()
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    params = SamplingParams(sampler="llada", max_tokens=16, block_length=8, ignore_eos=True)
    prompt = [[5, 6, 7, 8]]
    sharded = LLM(str(ckpt)).generate(prompt_token_ids=prompt, sampling_params=params)[0]
    single = LLM(str(PARITY / "llada-tiny")).generate(prompt_token_ids=prompt, sampling_params=params)[0]
    assert sharded.token_ids == single.token_ids


def test_missing_shard_is_named(tmp_path):
    ckpt = copy_fixture(tmp_path)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-2.safetensors"}}))
    with pytest.raises(CheckpointError, match="model-2.safetensors"):
        engine_for(ckpt)


def test_default_dtype_is_float32_on_cpu():
    engine = LLM(str(PARITY / "dream-tiny")).engine
    assert engine.dtype == torch.float32
    assert next(engine.runner.model.parameters()).dtype == torch.float32


def test_no_model_and_no_embedded_checkpoint_says_what_to_do(monkeypatch, tmp_path):
    import dlm_backend.engine.checkpoint.folder as loader
    monkeypatch.delenv("DLM_MODEL", raising=False)
    monkeypatch.setattr(loader, "EMBEDDED_MODEL", tmp_path / "assets" / "dlm-tiny")
    with pytest.raises(ModelNotFoundError, match="set DLM_MODEL"):
        loader.resolve_checkpoint(loader.default_model())
    monkeypatch.setenv("DLM_MODEL", str(PARITY / "llada-tiny"))
    assert loader.resolve_checkpoint(loader.default_model()) == PARITY / "llada-tiny"


def test_a_tensor_with_no_place_is_named_and_known_leftovers_are_skipped(tmp_path):
    """LLaDA with include_bias has biases on every layer; dropping them gave wrong logits silently."""
    ckpt = copy_fixture(tmp_path)
    state = load_file(str(ckpt / "model.safetensors"))
    save_file({**state, "model.transformer.rotary_emb.inv_freq": torch.ones(4)}, str(ckpt / "model.safetensors"))
    engine_for(ckpt)
    save_file({**state, "model.transformer.blocks.0.ff_out.bias": torch.zeros(64)}, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no place for: model\.transformer\.blocks\.0\.ff_out\.bias"):
        engine_for(ckpt)


def test_broken_files_are_checkpoint_errors_naming_them(tmp_path):
    ckpt = copy_fixture(tmp_path)
    weights = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(weights[:len(weights) // 2])        # a download cut short
    with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors file"):
        engine_for(ckpt)
    (ckpt / "model.safetensors").write_bytes(weights)
    (ckpt / "generation_config.json").write_text('{"eos_token_id": ')
    with pytest.raises(CheckpointError, match="generation_config.json is not valid JSON"):
        engine_for(ckpt)


def test_a_name_that_is_neither_folder_nor_hub_id_says_so(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither an existing folder nor a hub id"):
        engine_for("my model")


def test_a_sharded_pickle_checkpoint_is_refused_by_its_index(tmp_path):
    """A hub download never fetches .bin files, but it does fetch pytorch_model.bin.index.json."""
    ckpt = copy_fixture(tmp_path)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(UnsafeCheckpointError, match="pytorch_model.bin.index.json"):
        engine_for(ckpt)


def _edit_config(ckpt, **changes):
    config = json.loads((ckpt / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (ckpt / "config.json").write_text(json.dumps(config))


def test_config_mistakes_are_named_not_tracebacks_or_ignored(tmp_path):
    ckpt = copy_fixture(tmp_path)
    _edit_config(ckpt, architectures="LLaDAModelLM")              # a string, not a list: was split per letter
    assert engine_for(ckpt).architecture == "LLaDAModelLM"
    _edit_config(ckpt, rope_scaling={"type": "yarn", "factor": 4.0})  # loaded and silently ignored
    with pytest.raises(CheckpointError, match="rope_scaling .* plain RoPE only"):
        engine_for(ckpt)
    _edit_config(ckpt, rope_scaling=None, hidden_size=None, d_model=None)   # was a KeyError
    with pytest.raises(CheckpointError, match="config.json lacks"):
        engine_for(ckpt)
    with pytest.raises(ModelNotFoundError, match="is a file; pass the folder"):
        engine_for(ckpt / "config.json")


def test_a_broken_tokenizer_config_is_an_error_not_a_missing_tokenizer(tmp_path):
    from tests.helpers import make_chat_checkpoint
    from dlm_backend.errors import TokenizerError
    ckpt = make_chat_checkpoint(tmp_path / "chat", "dream")
    (ckpt / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer files do not load"):
        engine_for(ckpt)


@pytest.mark.parametrize("family,field,value,rule", [
    ("dream-tiny", "rope_theta", 1e-300, r"rope_theta must be a number in \(1, 1e\+12\], got 1e-300"),
    ("llada-tiny", "rope_theta", 0.5, r"rope_theta must be a number in \(1, 1e\+12\]"),
    ("dream-tiny", "rms_norm_eps", 1e-300, r"rms_norm_eps must be a number in \[1e-12, 1\]"),
    ("llada2-tiny", "routed_scaling_factor", 1e4, r"routed_scaling_factor must be a number in \[0.01, 100\]"),
])
def test_float_fields_are_kept_to_ranges_that_give_a_finite_model(tmp_path, family, field, value, rule):
    """rope_theta 1e-300 loaded, then every request failed with NaN logits, in float32 too."""
    src = PARITY / family if family != "llada2-tiny" else FIXTURES / "parity-block" / family
    ckpt = shutil.copytree(src, tmp_path / family)
    _edit_config(ckpt, mask_token_id=1, **{field: value})
    with pytest.raises(CheckpointError, match=rule):
        engine_for(ckpt)


def test_special_token_ids_outside_the_vocabulary_are_named_at_load(tmp_path):
    """Loaded fine before, then every request failed inside the engine with an IndexError."""
    ckpt = copy_fixture(tmp_path)
    _edit_config(ckpt, mask_token_id=10**6)
    with pytest.raises(CheckpointError, match=r"mask_token_id must be an integer in \[0, 319\], got 1000000"):
        engine_for(ckpt)


@pytest.mark.parametrize("method, says", [("bitsandbytes", "bitsandbytes 4/8-bit"), ("mlx", "MLX quantized"),
                                          ("modelopt", "ModelOpt FP8/NVFP4"), ("quanto", "a quantization format")])
def test_a_quantized_checkpoint_in_a_format_not_read_is_refused_naming_it(tmp_path, method, says):
    folder = shutil.copytree(PARITY / "llada-tiny", tmp_path / "q")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"quantized as '{method}' \\({says}.*reads gptq, awq, compressed-tensors, "
                                              "fp8 checkpoints and GGUF files"):
        LLM(str(folder))


def test_a_broken_gguf_file_or_folder_is_refused_naming_the_file(tmp_path):
    """A .gguf that is not a whole GGUF file (a truncated header, or not GGUF at all), given itself or
    as the one .gguf of a folder without config.json. Readable ones: test_gguf.py."""
    gguf = tmp_path / "dream-q4_k_m.gguf"
    for data in (b"GGUF\x03\x00\x00\x00", b"<html>not found</html>"):
        gguf.write_bytes(data)
        for model in (gguf, tmp_path):
            with pytest.raises(CheckpointError, match=f"{gguf} is not a readable GGUF file .*re-download it"):
                LLM(str(model)).engine
