"""GGUF files for the GGUF tests, written from a checkpoint folder in llama.cpp's converter layout.

It mirrors llama.cpp's ``convert_hf_to_gguf.py`` (now split into ``conversion/``): ``LLaDAModel``
(conversion/llada.py at commit 051139f511300aaf6159294433fab91c73ef7455), ``LLaDAMoEModel`` (the same file
at llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f: ``set_gguf_parameters`` and the Qwen2-MoE
``modify_tensors`` that stacks each layer's experts into ``mlp.experts.{down,gate,up}_proj``) and ``DreamModel``
(conversion/dream.py at 7bca1fd9ca2a681b0182e16f24f832b7be1942af) over ``TextModel.set_gguf_parameters``,
``_set_vocab_gpt2`` and ``get_vocab_base`` (conversion/base.py at 00bd27a621f92be9a99d24d7c5117a263b9b3c01).
The architecture string, metadata keys, tensor names (through ``gguf.TensorNameMap``, the converter's
table), LLaDA's q/k row permutation and the output types are the converter's; the tokenizer metadata
(merges, special token ids, chat template) is written by ``gguf.SpecialVocab``, the converter's own
class. What the converter does through ``transformers.AutoTokenizer`` (listing the vocabulary and
which added tokens are special) is done here with the ``tokenizers`` library on the same
tokenizer.json. Nothing of the engine's is used, so a test compares the engine against the layout,
not against itself.

Two departures for LLaDA-MoE, both because llada-moe-tiny is not the released model: a config.json
``mask_token_id`` (written by ``gguf.SpecialVocab``) replaces the converter's hard-coded 156895, which lies
outside a 320-token vocabulary, and the
fixture's shared expert, which the converter cannot map (its table for llada-moe has no shared-expert
tensors; the released model has none), is written under llama.cpp's ``ffn_*_shexp`` names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file
from tokenizers import Tokenizer

from dlm_backend.engine.checkpoint.load import open_checkpoint
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.models.registry import resolve_model_class
from tests.helpers import make_chat_checkpoint

ARCHES = {"LLaDAModelLM": gguf.MODEL_ARCH.LLADA, "DreamModel": gguf.MODEL_ARCH.DREAM,
          "LLaDAMoEModelLM": gguf.MODEL_ARCH.LLADA_MOE}
SHEXP = {"gate_proj": gguf.MODEL_TENSOR.FFN_GATE_SHEXP, "up_proj": gguf.MODEL_TENSOR.FFN_UP_SHEXP,
         "down_proj": gguf.MODEL_TENSOR.FFN_DOWN_SHEXP}


def _find(hparams: dict, keys: list[str]):
    return next((hparams[k] for k in keys if k in hparams), None)


def _parameters(w: gguf.GGUFWriter, hp: dict, arch: gguf.MODEL_ARCH, file_type: int) -> None:
    """TextModel.set_gguf_parameters, then the family's own additions."""
    w.add_block_count(_find(hp, ["n_layers", "num_hidden_layers", "n_layer", "num_layers"]))
    for add, keys in ((w.add_context_length, ["max_position_embeddings", "n_ctx", "n_positions", "max_length",
                                              "max_sequence_length", "model_max_length"]),
                      (w.add_embedding_length, ["hidden_size", "n_embd", "dim"]),
                      (w.add_feed_forward_length, ["prefix_dense_intermediate_size", "dense_intermediate_size",
                                                   "intermediate_size", "n_inner", "hidden_dim"]),
                      (w.add_head_count, ["num_attention_heads", "n_head", "n_heads"]),
                      (w.add_head_count_kv, ["num_key_value_heads", "n_kv_heads"]),
                      (w.add_rope_freq_base, ["rope_theta"]),
                      (w.add_layer_norm_rms_eps, ["rms_norm_eps", "norm_eps"]),
                      (w.add_expert_count, ["num_local_experts", "num_experts", "n_routed_experts"]),
                      (w.add_expert_used_count, ["num_experts_per_tok", "num_experts_per_token", "top_k_experts"])):
        if (value := _find(hp, keys)) is not None:
            add(value)
    w.add_file_type(file_type)
    w.add_causal_attention(False)
    if arch == gguf.MODEL_ARCH.LLADA_MOE:                   # LLaDAMoEModel.set_gguf_parameters
        if hp.get("expert_intermediate_size") is not None:
            w.add_expert_feed_forward_length(hp["expert_intermediate_size"])
        if hp.get("mask_token_id") is None:                 # else gguf.SpecialVocab writes config.json's
            w.add_mask_token_id(156895)
        w.add_diffusion_shift_logits(False)
    elif arch == gguf.MODEL_ARCH.DREAM:
        if hp.get("mask_token_id") is not None:
            w.add_mask_token_id(hp["mask_token_id"])
    else:                                                   # LLaDAModel.set_gguf_parameters
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(hp.get("head_dim") or hp["d_model"] // hp["n_heads"])
        w.add_context_length(hp.get("max_sequence_length", 4096))
        w.add_embedding_length(hp.get("d_model", 4096))
        w.add_feed_forward_length(hp.get("mlp_hidden_size", 12288))
        w.add_diffusion_shift_logits(False)


def _vocab(w: gguf.GGUFWriter, folder: Path, hp: dict, arch: gguf.MODEL_ARCH, pre: str) -> None:
    """_set_vocab_gpt2 with the families' get_vocab_base: ids the vocabulary lacks become [PAD{i}]
    (UNUSED), added special tokens CONTROL, other added tokens USER_DEFINED."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    reverse = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(hp.get("vocab_size", len(vocab))):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(reverse[i])
        types.append(gguf.TokenType.NORMAL if i not in added else
                     gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True).add_to_gguf(w, quiet=True)
    if arch == gguf.MODEL_ARCH.LLADA:
        w.add_add_bos_token(True)


def llama_permute(x: np.ndarray, heads: int) -> np.ndarray:
    """LLaDAModel.permute: each head's rows from HF's rotate-half order to llama.cpp's interleaved one."""
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


#: a tensor's stored type: F32 everywhere (--outtype f32), the converter's f16 rule, or a choice
OutType = T | str | Callable[[str, np.ndarray], T]


def _out_type(out: OutType, name: str, data: np.ndarray) -> T:
    if callable(out):
        return out(name, data)
    if out == "f16":            # the converter keeps 1-D tensors and norms in F32
        return T.F32 if data.ndim <= 1 or name.endswith("_norm.weight") else T.F16
    return out


def write_gguf(folder: Path, out: Path, pre: str = "gpt-2", types: OutType = T.F32,
               quantize: Callable[[np.ndarray, T], np.ndarray] | None = None) -> Path:
    """``folder`` (config.json, model.safetensors, tokenizer.json, tokenizer_config.json) as the GGUF
    file ``out``. ``types`` picks each tensor's type (by its GGUF name); ``quantize(array, type)`` makes
    the blocks of a quantized one (default: ``gguf.quants.quantize``)."""
    hp = json.loads((folder / "config.json").read_text())
    arch = ARCHES[hp["architectures"][0]]
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    _parameters(w, hp, arch, 0 if types == T.F32 else 1)
    _vocab(w, folder, hp, arch, pre)
    names = gguf.get_tensor_name_map(arch, _find(hp, ["n_layers", "num_hidden_layers"]))
    heads = _find(hp, ["num_attention_heads", "n_heads"])
    kv_heads = _find(hp, ["num_key_value_heads", "n_kv_heads"])
    for name, data in _merged(load_file(str(folder / "model.safetensors")), arch):
        data = data.astype(np.float32)
        if arch == gguf.MODEL_ARCH.LLADA:                   # LLaDAModel.modify_tensors (undo_permute = True)
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = llama_permute(data, heads)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                data = llama_permute(data, kv_heads if kv_heads is not None and kv_heads != heads else heads)
        part = name.split(".")
        new = (f"{gguf.TENSOR_NAMES[SHEXP[part[4]]].format(bid=part[2])}.weight" if "shared_expert" in part
               else names.get_name(name, try_suffixes=(".weight", ".bias")))
        kind = _out_type(types, new, data)
        if kind in (T.F32, T.F16):
            w.add_tensor(new, data.astype(np.float16 if kind == T.F16 else np.float32))
        elif kind == T.BF16:
            w.add_tensor(new, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            w.add_tensor(new, (quantize or gguf.quants.quantize)(data, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _merged(state: dict[str, np.ndarray], arch: gguf.MODEL_ARCH):
    """(name, tensor) as the converter hands them on: for LLaDA-MoE each layer's experts stacked on a new
    first axis in expert order, as ``model.layers.{bid}.mlp.experts.{w_name}.weight``, down, gate, up."""
    experts = {}
    for name, data in state.items():
        part = name.split(".")
        if arch == gguf.MODEL_ARCH.LLADA_MOE and "experts" in part:
            experts.setdefault((int(part[2]), part[6]), {})[int(part[5])] = data
        else:
            yield name, data
    for (bid, w_name), by_index in sorted(experts.items(), key=lambda kv: (kv[0][0], ["down_proj", "gate_proj",
                                                                                     "up_proj"].index(kv[0][1]))):
        yield f"model.layers.{bid}.mlp.experts.{w_name}.weight", np.stack([by_index[i] for i in sorted(by_index)])


#: byte offsets of each block's float16 fields (scales), per type: the rest of a block is levels
F16_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.Q2_K: (80, 82),
              T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_blocks(x: np.ndarray, kind: T, seed: int = 0) -> np.ndarray:
    """Blocks of ``kind`` for a tensor shaped like ``x [N, K]``: every level, scale and min byte
    random, each float16 field a finite random value, so all bit patterns of a layout occur."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    n, k = x.shape
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for at in F16_FIELDS[kind]:
        value = (rng.uniform(1e-3, 5e-2, (n, k // block)) * rng.choice([-1, 1], (n, k // block))).astype(np.float16)
        raw[..., at:at + 2] = value.view(np.uint8).reshape(n, k // block, 2)
    return raw.reshape(n, k // block * size)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K blocks for ``x [N, K]`` (K a multiple of 256): per 32 weights a 6-bit scale and min under
    the super-block's f16 ``d`` and ``dmin``. A plain min/max fit, not llama.cpp's search: valid blocks
    (``gguf.quants`` implements no K-quant quantizer), dequantizing to within a level of ``x``."""
    n, k = x.shape
    nb = k // 256
    b = x.reshape(n, nb, 8, 32).astype(np.float32)
    lo, hi = np.minimum(b.min(-1), 0), np.maximum(b.max(-1), 0)             # [n, nb, 8]
    d = ((hi - lo) / 15).max(-1) / 63
    dmin = (-lo).max(-1) / 63
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)                  # [n, nb]
    df, mf = d16.astype(np.float32)[..., None], dmin16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.round((hi - lo) / 15 / df), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(mf > 0, np.round(-lo / mf), 0).clip(0, 63).astype(np.uint8)
        step, low = (df * sc)[..., None], (mf * mn)[..., None]
        q = np.where(step > 0, np.round((b + low) / step), 0).clip(0, 15).astype(np.uint8)
    s = np.empty((n, nb, 12), np.uint8)
    s[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    s[..., 4:8] = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    s[..., 8:12] = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    q = q.reshape(n, nb, 4, 2, 32)                      # 32 bytes per 64 weights: low nibbles, then high
    qs = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(n, nb, 128)
    return np.concatenate([d16.view(np.uint8).reshape(n, nb, 2), dmin16.view(np.uint8).reshape(n, nb, 2), s, qs],
                          axis=-1).reshape(n, nb * 144)


FAMILIES = ("llada", "dream")
TEXTS = ["The quick brown fox jumps over the lazy dog.", "  two  spaces\tand a tab\n\nnew lines 12345 + 678",
         "Paris, 'tis the capital! Isn't it? I'VE been there", "café naïve 東京 🚀 ﬁ",
         "<|endoftext|>between<|im_end|>"]


def chat_gguf(tmp_path, family: str, **kw):
    """(a chat-ready copy of the family's parity fixture, its GGUF file)."""
    folder = make_chat_checkpoint(tmp_path / family, family)
    return folder, write_gguf(folder, tmp_path / f"{family}.gguf", **kw)


def open_gguf(path):
    """The checkpoint a GGUF file opens as, float32 on CPU."""
    return open_checkpoint(EngineConfig(str(path), device="cpu", dtype="float32"))


def wide_checkpoint(tmp_path, family: str = "llada", **config):
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


def finish(w: gguf.GGUFWriter) -> None:
    """Write a GGUFWriter's file out."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
