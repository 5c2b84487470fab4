"""GGUF files (llama.cpp's format) as checkpoints: engine/checkpoint/gguf_file.py and gguf_names.py;
float files load the fixtures exactly, and what is refused, how. Every file here is written by tests/engine/checkpoint/gguf_writer.py in llama.cpp's converter layout
(LLaDAModel, DreamModel), from the parity fixtures' weights and the test tokenizer of tests/helpers.py."""

import dataclasses
import json
import time

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from tests.engine.checkpoint.gguf_writer import (FAMILIES, finish, wide_checkpoint, write_gguf, chat_gguf as _chat_gguf, open_gguf as _open)
from tests.helpers import PARITY, make_chat_checkpoint

from dlm_backend import LLM, SamplingParams, cli
from dlm_backend.engine.checkpoint.folder import context_length, resolve_checkpoint
from dlm_backend.engine.checkpoint.gguf_file import GGUFFile, gguf_config
from dlm_backend.engine.models.registry import resolve_model_class
from dlm_backend.errors import CheckpointError


# --- (a) float GGUF files load the fixtures exactly -------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_an_f32_gguf_passes_the_fixtures_parity_cases_exactly(tmp_path, capsys, family):
    """`dlm parity FIXTURE --model FILE.gguf`: every recorded case's tokens and every forward tensor
    of the fixture, on an engine built from the GGUF file instead of the fixture's safetensors."""
    _, path = _chat_gguf(tmp_path, family)
    assert cli.main(["parity", str(PARITY / f"{family}-tiny"), "--model", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 9 and any(": forward" in line for line in lines)
    assert not [line for line in lines[:-1] if not line.startswith("ok ")]
    assert lines[-1].startswith(f"{len(lines) - 1}/{len(lines) - 1} cases exact")


@pytest.mark.parametrize("family", FAMILIES)
def test_an_f32_gguf_holds_the_safetensors_weights_bit_for_bit(tmp_path, family):
    folder, path = _chat_gguf(tmp_path, family)
    want, got = _open(folder), _open(path)
    assert got.hf_config["architectures"] == want.hf_config["architectures"]
    a, b = want.model.state_dict(), got.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The file names the tokenizer's BOS (tokenizer_config.json's), which LLaDA's config.json leaves out.
    assert got.tokens == want.tokens
    assert dataclasses.replace(got.model.args, bos_token_id=want.model.args.bos_token_id) == want.model.args
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    q = torch.from_numpy(np.array(stored["blk.0.attn_q.weight"].data))
    hf = a["model.transformer.blocks.0.q_proj.weight" if family == "llada" else
           "model.layers.0.self_attn.q_proj.weight"]
    # LLaDA's q/k rows are stored interleaved for llama.cpp's rope and put back on load; Dream's are not moved.
    assert torch.equal(q, hf) == (family == "dream")


def test_llada_k_rows_are_put_back_by_the_key_value_head_count(tmp_path):
    """With fewer key/value heads than query heads the converter interleaves k by n_kv_heads."""
    folder = wide_checkpoint(tmp_path, n_kv_heads=2)
    want, got = _open(folder).model.state_dict(), _open(write_gguf(folder, tmp_path / "gqa.gguf")).model.state_dict()
    assert want["model.transformer.blocks.0.k_proj.weight"].shape == (128, 256)
    assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.parametrize("kind, dtype", [("f16", torch.float16), (T.BF16, torch.bfloat16)])
def test_f16_and_bf16_ggufs_load_the_weights_rounded_once(tmp_path, kind, dtype):
    folder, path = _chat_gguf(tmp_path, "llada", types=kind if kind == "f16" else (
        lambda name, data: T.F32 if data.ndim == 1 else T.BF16))
    a, b = _open(folder).model.state_dict(), _open(path).model.state_dict()
    assert all(torch.equal(b[k], a[k].to(dtype).float() if a[k].dim() == 2 else a[k]) for k in a)


def test_llm_generates_the_same_tokens_from_the_gguf_file_or_its_folder(tmp_path):
    folder, path = _chat_gguf(tmp_path, "dream")
    params = SamplingParams(max_tokens=16, steps=16, temperature=0.0)
    outputs = []
    for model in (folder, path, tmp_path / "only"):
        if model.name == "only":                # a folder holding the one .gguf and no config.json
            model.mkdir()
            path.rename(model / path.name)
        with LLM(str(model)) as llm:
            outputs.append(llm.generate("The quick brown fox", params)[0].token_ids)
            assert llm.chat([{"role": "user", "content": "hi"}], params).token_ids
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) > 0


def test_context_length_and_config_come_from_the_metadata(tmp_path):
    _, path = _chat_gguf(tmp_path, "llada")
    assert context_length(str(path)) == 512
    config = gguf_config(path)
    want = json.loads((PARITY / "llada-tiny" / "config.json").read_text())
    assert {k: config[k] for k in ("d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "rope_theta",
                                   "rms_norm_eps", "mask_token_id", "eos_token_id", "weight_tying")} == \
        {k: want[k] for k in ("d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "rope_theta",
                              "rms_norm_eps", "mask_token_id", "eos_token_id", "weight_tying")}
    assert resolve_model_class(config).__name__ == "LLaDAModelLM"



# --- (d) what is refused, and how -----------------------------------------------------------------

def _metadata_only(path, arch: str, **keys) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        w.add_uint32(key.replace("__", "."), value)
    finish(w)


def test_an_unknown_or_unrun_architecture_is_named(tmp_path):
    _metadata_only(tmp_path / "m.gguf", "mystery")
    with pytest.raises(CheckpointError, match=r"m.gguf: GGUF architecture 'mystery' is not supported\. Supported GGUF "
                                              r"architectures: llada, dream, llada-moe\."):
        LLM(str(tmp_path / "m.gguf")).engine
    _metadata_only(tmp_path / "dg.gguf", "diffusion-gemma")
    with pytest.raises(CheckpointError, match=r"'diffusion-gemma' is not supported \(DiffusionGemma runs from its "
                                              r"safetensors release only"):
        context_length(str(tmp_path / "dg.gguf"))


def test_an_unsupported_tensor_type_is_named_before_anything_is_built(tmp_path):
    folder = wide_checkpoint(tmp_path)
    path = write_gguf(folder, tmp_path / "iq.gguf", types=lambda n, d: T.IQ2_XXS if n == "output.weight" else T.F32,
                      quantize=lambda x, k: np.zeros((x.shape[0], x.shape[1] // 256 * 66), np.uint8))
    with pytest.raises(CheckpointError, match=r"iq.gguf: tensor output.weight is IQ2_XXS, a type this engine does not "
                                              r"read\. It reads F32, F16, BF16, Q4_0.*Q6_K: use a file quantized"):
        LLM(str(path)).engine


def test_a_folder_with_two_gguf_files_asks_for_one(tmp_path):
    _, path = _chat_gguf(tmp_path, "llada")
    (tmp_path / "models").mkdir()
    for name in ("llada-Q4_K_M.gguf", "llada-Q8_0.gguf"):
        (tmp_path / "models" / name).write_bytes(path.read_bytes())
    with pytest.raises(CheckpointError, match=r"holds 2 GGUF files \(llada-Q4_K_M.gguf, llada-Q8_0.gguf\) and no "
                                              r"config.json\. Pass the one to load"):
        LLM(str(tmp_path / "models")).engine
    (tmp_path / "models" / "config.json").write_text("{}")        # a safetensors folder: its GGUF files are not read
    assert resolve_checkpoint(tmp_path / "models") == tmp_path / "models"


@pytest.mark.parametrize("keep", [0.5, 0.02, 24])
def test_a_truncated_file_is_refused_naming_it(tmp_path, keep):
    _, path = _chat_gguf(tmp_path, "llada")
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(CheckpointError, match=r"llada.gguf is not a readable GGUF file \(.*\)\. A download may have "
                                              r"stopped part way"):
        LLM(str(path)).engine


@pytest.mark.parametrize("header", [
    # tensor count 2^60, kv count 0
    b"GGUF" + (3).to_bytes(4, "little") + (1 << 60).to_bytes(8, "little") + (0).to_bytes(8, "little"),
    # one key holding a uint8 array that claims 2^40 elements
    b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    + (1).to_bytes(8, "little") + b"k" + (9).to_bytes(4, "little") + (0).to_bytes(4, "little")
    + (1 << 40).to_bytes(8, "little") + bytes(64),
    # one key holding an array of arrays 100,000 deep
    b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    + (1).to_bytes(8, "little") + b"k" + ((9).to_bytes(4, "little") + (1).to_bytes(8, "little")) * 100_000,
], ids=["tensor-count", "array-length", "nested-arrays"])
def test_a_header_claiming_absurd_sizes_fails_fast(tmp_path, header):
    (tmp_path / "x.gguf").write_bytes(header)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match="is not a readable GGUF file"):
        GGUFFile(tmp_path / "x.gguf")
    assert time.monotonic() - start < 5


def test_metadata_goes_through_the_config_range_checks(tmp_path):
    _metadata_only(tmp_path / "big.gguf", "llada", llada__block_count=100000, llada__embedding_length=64,
                   llada__vocab_size=320, llada__attention__head_count=4, llada__feed_forward_length=160)
    with pytest.raises(CheckpointError, match=r"big.gguf \(its GGUF metadata, read as config.json fields\): "
                                              r"n_layers must be an integer in \[1, 1024\], got 100000.*"
                                              r"n_layers is llada.block_count"):
        context_length(str(tmp_path / "big.gguf"))
    _metadata_only(tmp_path / "lack.gguf", "dream", dream__block_count=2)
    with pytest.raises(CheckpointError, match=r"lack.gguf: the GGUF metadata lacks 'dream.embedding_length'"):
        gguf_config(tmp_path / "lack.gguf")


def test_contradicting_or_unsupported_metadata_is_refused(tmp_path):
    folder = make_chat_checkpoint(tmp_path / "llada", "llada")
    path = write_gguf(folder, tmp_path / "a.gguf")
    for key, value, says in [("diffusion.shift_logits", True, "diffusion.shift_logits is true, but LLaDAModelLM never "
                                                              "reads position i's token from output i - 1"),
                             ("split.count", 3, r"is part 1 of a GGUF split into 3 files; merge them first"),
                             ("tokenizer.ggml.pre", "tekken", "GGUF pre-tokenizer 'tekken' is not one this engine "
                                                              "rebuilds")]:
        edited = _rewrite(path, tmp_path / f"{key}.gguf", key, value)
        with pytest.raises(CheckpointError, match=says):
            LLM(str(edited)).engine


def _rewrite(path, out, key, value):
    """``path`` with one metadata key set (added when absent)."""
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(out), reader.get_field("general.architecture").contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), field.types[0], sub)
    kind = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.UINT32, str: gguf.GGUFValueType.STRING}[type(value)]
    w.add_key_value(key, value, kind)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data))
    finish(w)
    return out
