"""LLaDA-MoE GGUF files (llama.cpp's ``llada-moe``, its experts stacked per layer) as checkpoints:
written by tests/engine/checkpoint/gguf_writer.py in llama.cpp's converter layout from llada-moe-tiny's
weights, with the test tokenizer of tests/helpers.py (the fixture has none)."""

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import load_file, save_file
from tests.engine.checkpoint.gguf_writer import open_gguf, write_gguf
from tests.helpers import LLAMA3, PARITY, build_tokenizer

from dlm_backend import LLM, SamplingParams, cli
from dlm_backend.engine.checkpoint.gguf_file import GGUFFile, gguf_config
from dlm_backend.engine.quant.experts import QuantizedExperts
from dlm_backend.engine.quant.int_weight import IntWeight

FIXTURE = PARITY / "llada-moe-tiny"


def moe_folder(tmp_path, shared: bool = True):
    """llada-moe-tiny with a tokenizer (LLaDA's test one: mask 300, EOS 301) and its mask id in
    config.json; ``shared=False`` drops the shared expert, as the released model has none."""
    folder = tmp_path / ("moe" if shared else "moe-unshared")
    folder.mkdir()
    shutil.copy(FIXTURE / "generation_config.json", folder)
    config = json.loads((FIXTURE / "config.json").read_text())
    config["mask_token_id"] = 300
    state = load_file(str(FIXTURE / "model.safetensors"))
    if not shared:
        config["shared_expert_intermediate_size"] = None
        state = {k: v for k, v in state.items() if ".shared_expert." not in k}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    build_tokenizer("llada").save(str(folder / "tokenizer.json"))
    # No mask_token here: gguf.SpecialVocab writes the mask id from config.json already.
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "chat_template": LLAMA3}))
    return folder


def test_an_f32_llada_moe_gguf_passes_the_fixtures_parity_cases_exactly(tmp_path, capsys):
    path = write_gguf(moe_folder(tmp_path), tmp_path / "moe.gguf")
    assert cli.main(["parity", str(FIXTURE), "--model", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and any(": forward" in line for line in lines)
    assert not [line for line in lines[:-1] if not line.startswith("ok ")]
    assert lines[-1].startswith(f"{len(lines) - 1}/{len(lines) - 1} cases exact")


@pytest.mark.parametrize("shared", [True, False])
def test_stacked_experts_land_on_the_stacked_parameters_bit_for_bit(tmp_path, shared):
    folder = moe_folder(tmp_path, shared)
    path = write_gguf(folder, tmp_path / "moe.gguf")
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    # The converter's layout: one [E, I, D] tensor per projection and layer, q/k rows not moved (NEOX rope).
    assert tuple(reversed(stored["blk.1.ffn_gate_exps.weight"].shape.tolist())) == (8, 32, 64)
    assert tuple(reversed(stored["blk.1.ffn_down_exps.weight"].shape.tolist())) == (8, 64, 32)
    assert ("blk.0.ffn_gate_shexp.weight" in stored) == shared
    assert not [n for n in stored if ".experts." in n or n.startswith("model.")]
    want, got = open_gguf(folder), open_gguf(path)
    a, b = want.model.state_dict(), got.model.state_dict()
    assert "model.layers.0.mlp.experts.gate_proj" in b
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert got.model.moe == want.model.moe and got.model.args.mask_token_id == 300
    assert got.model.moe.shared_intermediate_size == (48 if shared else 0)


def test_the_config_comes_from_the_llada_moe_metadata(tmp_path):
    config = gguf_config(write_gguf(moe_folder(tmp_path), tmp_path / "moe.gguf"))
    want = json.loads((FIXTURE / "config.json").read_text())
    fields = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size",
              "dense_intermediate_size", "expert_intermediate_size", "shared_expert_intermediate_size",
              "num_experts", "num_experts_per_tok", "rope_theta", "rms_norm_eps", "max_position_embeddings",
              "tie_word_embeddings", "qk_layernorm", "attention_bias", "moe_layer_freq", "eos_token_id")
    assert {k: config[k] for k in fields} == {k: want[k] for k in fields}
    assert config["architectures"] == ["LLaDAMoEModelLM"] and config["mask_token_id"] == 300


def _quantized(kind: T):
    """``kind`` for every matrix whose rows are whole 32-weight blocks (the shared expert's 48-wide
    down_proj stays F32, as llama.cpp's converter falls back for it), F32 for the rest."""
    return lambda name, data: kind if data.ndim >= 2 and data.shape[-1] % 32 == 0 else T.F32


@pytest.mark.parametrize("kind", [T.Q8_0, T.Q4_0])
def test_quantized_stacked_experts_load_as_quantized_experts_and_decode(tmp_path, kind):
    folder = moe_folder(tmp_path)
    path = write_gguf(folder, tmp_path / f"moe-{kind.name}.gguf", types=_quantized(kind))
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert stored["blk.0.ffn_up_exps.weight"].tensor_type == kind
    # What the source hands the loader: each stacked tensor as E IntWeights of the file's own blocks.
    read = 0
    for entry, tensor in zip(GGUFFile(path).source().entries("cpu", lambda n: None), gguf.GGUFReader(path).tensors):
        if "_exps." not in tensor.name:
            continue
        value = entry.read()
        assert isinstance(value, QuantizedExperts) and value.shape == entry.shape and len(value) == 8
        assert all(isinstance(e, IntWeight) for e in value.experts)
        got = torch.stack([e.dequantize(torch.float32) for e in value.experts]).numpy()
        assert np.array_equal(got, gguf.quants.dequantize(tensor.data, kind))
        read += 1
    assert read == 6
    model = open_gguf(path).model
    for layer in model.model.layers:
        assert all(isinstance(getattr(layer.mlp.experts, p), QuantizedExperts)
                   for p in ("gate_proj", "up_proj", "down_proj"))
    params = SamplingParams(max_tokens=8, steps=8, temperature=0.0)
    with LLM(str(path)) as llm:
        out = llm.generate("The quick brown fox", params)[0]
    assert len(out.token_ids) > 0


def _experts_of(gate) -> list[dict]:
    """Each expert of a stack as its tensors (a quantized one's buffers, as laid out for the device)."""
    if isinstance(gate, QuantizedExperts):
        return [{k: v.clone() for k, v in e.state_dict().items()} for e in gate.experts]
    return [{"w": w.clone()} for w in gate.detach()]


def test_stacked_experts_partition_over_two_ranks(tmp_path):
    """Each rank takes its half of every whole [E, ...] stack (experts 0-3 on rank 0), float or
    quantized; two gloo ranks decode a float file's one-device tokens. (Q8_0's tokens are not compared:
    its CPU kernels run in bfloat16, where llada-moe-tiny's near-tied logits flip with the split sums.)"""
    folder = moe_folder(tmp_path)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
    for kind in (T.F32, T.Q8_0):
        path = write_gguf(folder, tmp_path / f"tp-{kind.name}.gguf", types=_quantized(kind))
        outputs, stacks = [], []
        for ranks in (1, 2):
            with LLM(str(path), device="cpu", dtype="float32", tensor_parallel_size=ranks,
                     prefix_caching=False) as llm:
                params = llm.sampling_params(temperature=0.0, ignore_eos=True, max_tokens=8)
                outputs.append([o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)])
                gate = llm.engine.model.model.layers[1].mlp.experts.gate_proj
                assert len(gate) == 8 // ranks and isinstance(gate, QuantizedExperts) == (kind == T.Q8_0)
                stacks.append(_experts_of(gate))
        assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
                   for a, b in zip(stacks[0][:4], stacks[1], strict=True))
        assert kind != T.F32 or outputs[0] == outputs[1]
