"""GGUF files (llama.cpp's format) as checkpoints: engine/checkpoint/gguf_file.py, gguf_names.py,
gguf_blocks.py, gguf_tokenizer.py. Every file here is written by tests/engine/checkpoint/gguf_writer.py in
llama.cpp's converter layout (LLaDAModel, DreamModel), from the parity fixtures' weights and the test
tokenizer of tests/helpers.py."""

import dataclasses
import json
import shutil
import time

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file
from tests.engine.checkpoint.gguf_writer import llama_permute, quantize_q4_k, random_blocks, write_gguf
from tests.helpers import CHATML, PARITY, make_chat_checkpoint
from tokenizers import Regex, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from dlm_backend import cli
from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.checkpoint.folder import context_length, resolve_checkpoint
from dlm_backend.engine.checkpoint.gguf_blocks import unpack
from dlm_backend.engine.checkpoint.gguf_file import GGUFFile, gguf_config
from dlm_backend.engine.checkpoint.gguf_tokenizer import LLAMA3, QWEN2
from dlm_backend.engine.checkpoint.load import open_checkpoint
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.models.registry import resolve_model_class
from dlm_backend.engine.quant.int_weight import IntWeight
from dlm_backend.errors import CheckpointError
from dlm_backend.parity.forward import packed_logits

FAMILIES = ("llada", "dream")
TEXTS = ["The quick brown fox jumps over the lazy dog.", "  two  spaces\tand a tab\n\nnew lines 12345 + 678",
         "Paris, 'tis the capital! Isn't it? I'VE been there", "café naïve 東京 🚀 ﬁ",
         "<|endoftext|>between<|im_end|>"]


def _chat_gguf(tmp_path, family: str, **kw):
    folder = make_chat_checkpoint(tmp_path / family, family)
    return folder, write_gguf(folder, tmp_path / f"{family}.gguf", **kw)


def _open(path):
    return open_checkpoint(EngineConfig(str(path), device="cpu", dtype="float32"))


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
    folder = _wide_checkpoint(tmp_path, n_kv_heads=2)
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


# --- (b) quantized tensors ------------------------------------------------------------------------

def _wide_checkpoint(tmp_path, family: str = "llada", **config):
    """A parity checkpoint widened so every weight's rows are whole 256-weight K-quant super-blocks
    (width 256, MLP 512, 4 heads of 64), its weights drawn at random (seeded)."""
    wide = {"llada": {"d_model": 256, "mlp_hidden_size": 512}, "dream": {"hidden_size": 256, "intermediate_size": 512}}
    folder = make_chat_checkpoint(tmp_path / f"wide-{family}", family, **wide[family], **config)
    config = json.loads((folder / "config.json").read_text())
    torch.manual_seed(0)
    model = resolve_model_class(config).from_config(config)
    state = {k: (torch.randn_like(v) * (0.05 if v.dim() == 2 else 0.1) + (1.0 if v.dim() == 1 else 0.0))
             for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    return folder


QUANTS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]


@pytest.mark.parametrize("kind", QUANTS, ids=lambda k: k.name)
def test_each_quantized_type_unpacks_to_exactly_what_gguf_dequantizes(tmp_path, kind):
    """Every 2-D weight stored as ``kind`` (all level bits random, scales random finite f16) reads as an
    IntWeight whose dequantize() is gguf.quants.dequantize of the same bytes: equal in value and bit
    for bit wherever not zero (gguf computes Q4_0's and Q5_0's d * (q - 8); ours, q d - 8 d, gives +0
    where that gives -0 for a negative d)."""
    folder = _wide_checkpoint(tmp_path)
    path = write_gguf(folder, tmp_path / "q.gguf", types=lambda n, d: kind if d.ndim == 2 else T.F32,
                      quantize=lambda x, k: random_blocks(x, k, seed=len(x.tobytes())))
    file = GGUFFile(path)
    heads = {"attn_q": 4, "attn_k": 4}
    read = 0
    for entry, tensor in zip(file.source().entries("cpu", lambda n: None), file.reader.tensors):
        if tensor.tensor_type != kind:
            continue
        value = entry.read()
        got = value.dequantize() if isinstance(value, IntWeight) else value
        assert isinstance(value, IntWeight) != entry.name.endswith(("wte.weight", "transformer.ff_out.weight"))
        if isinstance(value, IntWeight):
            assert value.shape == entry.shape and value.bits <= 8
        part = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        got = got.numpy() if part not in heads else llama_permute(got.numpy(), heads[part])
        want = gguf.quants.dequantize(tensor.data, kind)
        assert np.array_equal(got, want)
        nonzero = want != 0
        assert np.array_equal(got[nonzero].view(np.uint32), want[nonzero].view(np.uint32))
        read += 1
    assert read == 2 + 2 * 7


def test_legacy_types_quantized_by_gguf_unpack_exactly(tmp_path):
    x = np.random.default_rng(1).standard_normal((32, 256)).astype(np.float32)
    for kind in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        raw = gguf.quants.quantize(x, kind)
        q, scale, offset, bits = unpack(raw, kind, 32, 256)
        offset = None if offset is None else torch.from_numpy(offset)
        w = IntWeight(torch.from_numpy(q), torch.from_numpy(scale), offset, bits)
        assert np.array_equal(w.dequantize().numpy(), gguf.quants.dequantize(raw, kind)), kind.name


def _dequantized_twin(folder, dest, family: str, quantize):
    """``folder`` with each 2-D weight replaced by what its quantized blocks stand for
    (``gguf.quants.dequantize``), quantized in the converter's row order (LLaDA's q/k interleaved)."""
    twin = shutil.copytree(folder, dest)
    state = load_numpy(str(folder / "model.safetensors"))
    for name, w in state.items():
        if w.ndim == 2 and family == "llada" and name.endswith(("q_proj.weight", "k_proj.weight")):
            stored = gguf.quants.dequantize(quantize(llama_permute(w, 4)), _KIND[quantize])
            state[name] = stored.reshape(4, -1, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        elif w.ndim == 2:
            state[name] = gguf.quants.dequantize(quantize(w), _KIND[quantize])
    save_numpy(state, str(twin / "model.safetensors"))
    return twin


def _q8_0(x):
    return gguf.quants.quantize(x, T.Q8_0)


_KIND = {_q8_0: T.Q8_0, quantize_q4_k: T.Q4_K}


@pytest.mark.parametrize("quantize, tol", [(_q8_0, 0.03), (quantize_q4_k, 0.03)], ids=["Q8_0", "Q4_K"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_quantized_model_decodes_as_the_float_model_of_its_weights(tmp_path, family, quantize, tol):
    """Greedy logits of a Q8_0 / Q4_K file against a float model holding the weights its blocks stand
    for: Q4_K on the int4 kernel, Q8_0 as two 4-bit halves on it, both with bf16 activations
    (measured: Q4_K 1.2% and 0.7% of the largest logit); the same token wins at most positions."""
    folder, kind = _wide_checkpoint(tmp_path, family), _KIND[quantize]
    path = write_gguf(folder, tmp_path / "q.gguf", types=lambda n, d: kind if d.ndim == 2 else T.F32,
                      quantize=lambda x, k: quantize(x))
    want, got = _open(_dequantized_twin(folder, tmp_path / "twin", family, quantize)), _open(path)
    kernels = {m.exec for m in got.model.modules() if isinstance(m, IntWeight)}
    assert kernels == ({"int4pack"} if kind == T.Q4_K else {"int4x2"})
    rows = torch.tensor([[18, 6, 128, 277, 152, 118, 81, 36, 3, 146, 13, 205, 300, 300, 300, 300]])
    a, b = packed_logits(want.model, rows, None), packed_logits(got.model, rows, None)
    assert (a - b).abs().max() <= tol * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


# --- (c) tokenizer and chat template from the metadata ---------------------------------------------

def _variant(folder, pre: str):
    """The fixture's tokenizer.json as Qwen2's (Dream's) or Llama 3's are built: their split regex
    before byte-level BPE (and NFC for Qwen2, whole-word lookup for Llama 3)."""
    data = json.loads((folder / "tokenizer.json").read_text())
    tok = HFTokenizer.from_str(json.dumps(data))
    regex = QWEN2 if pre == "qwen2" else LLAMA3
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = pre == "llama-bpe"
    (folder / "tokenizer.json").write_text(json.dumps(data))


@pytest.mark.parametrize("family, pre", [("dream", "gpt-2"), ("llada", "gpt-2"), ("dream", "qwen2"),
                                         ("llada", "llama-bpe")])
def test_the_tokenizer_built_from_metadata_encodes_and_decodes_as_tokenizer_json(tmp_path, family, pre):
    folder = make_chat_checkpoint(tmp_path / family, family)
    if pre != "gpt-2":
        _variant(folder, pre)
    path = write_gguf(folder, tmp_path / "t.gguf", pre=pre)
    want, got = Tokenizer(folder), GGUFFile(path).tokenizer()
    for text in TEXTS:
        ids = want.encode(text)
        assert got.encode(text) == ids, text
        assert got.decode(ids) == want.decode(ids) and got.decode(ids, False) == want.decode(ids, False)
    # gguf.SpecialVocab takes a BOS id config.json names when tokenizer_config.json has none (Dream's 302).
    assert got.special_tokens.items() >= want.special_tokens.items()
    assert got.vocab_size == want.vocab_size
    assert got.control_tokens().ids == want.control_tokens().ids
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2 + 2?"}]
    assert got.chat_template == want.chat_template
    assert got.apply_chat_template(messages) == want.apply_chat_template(messages)
    assert got.end_of_turn_ids() == want.end_of_turn_ids()


def test_named_chat_templates_come_back_by_name(tmp_path):
    folder = make_chat_checkpoint(tmp_path / "dream", "dream")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": "{{ tools }}"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    got = GGUFFile(write_gguf(folder, tmp_path / "t.gguf")).tokenizer()
    assert got.templates == {"default": CHATML, "tool_use": "{{ tools }}"}
    assert got.renders_tools


def test_a_file_without_a_vocabulary_loads_for_token_ids(tmp_path):
    _, path = _chat_gguf(tmp_path, "llada")
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "llada")
    for field in reader.fields.values():
        if field.name.startswith(("llada.", "diffusion.")):
            w.add_key_value(field.name, field.contents(), field.types[0])
    w.add_mask_token_id(300)
    w.add_eos_token_id(301)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data))
    _finish(w)
    with LLM(str(tmp_path / "bare.gguf")) as llm:
        assert llm.engine.checkpoint.tokenizer is None
        out = llm.generate(prompt_token_ids=[18, 6, 128], sampling_params=SamplingParams(max_tokens=8, steps=8))
        assert len(out[0].token_ids) > 0


# --- (d) what is refused, and how -----------------------------------------------------------------

def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _metadata_only(path, arch: str, **keys) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        w.add_uint32(key.replace("__", "."), value)
    _finish(w)


def test_an_unknown_or_unrun_architecture_is_named(tmp_path):
    _metadata_only(tmp_path / "m.gguf", "mystery")
    with pytest.raises(CheckpointError, match=r"m.gguf: GGUF architecture 'mystery' is not supported\. Supported GGUF "
                                              r"architectures: llada, dream\."):
        LLM(str(tmp_path / "m.gguf")).engine
    _metadata_only(tmp_path / "moe.gguf", "llada-moe")
    with pytest.raises(CheckpointError, match=r"'llada-moe' is not supported \(LLaDA-MoE .* has no implementation"):
        context_length(str(tmp_path / "moe.gguf"))


def test_an_unsupported_tensor_type_is_named_before_anything_is_built(tmp_path):
    folder = _wide_checkpoint(tmp_path)
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
    _finish(w)
    return out


def test_a_quantized_gguf_splits_over_two_ranks(tmp_path):
    """The worker rank reads the file through the same config and source (forward/workers.py): two
    gloo ranks give the one-device tokens of a Q8_0 file, each holding its rows or columns of every
    weight."""
    folder = _wide_checkpoint(tmp_path)
    path = write_gguf(folder, tmp_path / "q8.gguf", types=lambda n, d: T.Q8_0 if d.ndim == 2 else T.F32)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
    outputs = []
    for ranks in (1, 2):
        with LLM(str(path), device="cpu", dtype="float32", tensor_parallel_size=ranks) as llm:
            params = llm.sampling_params(temperature=0.0, ignore_eos=True, max_tokens=8)
            outputs.append([o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)])
            q = llm.engine.model.model.transformer.blocks[0].q_proj.weight
            assert isinstance(q, IntWeight) and tuple(q.shape) == (256 // ranks, 256)
    assert outputs[0] == outputs[1]
