"""The llama.cpp architectures this engine runs from a GGUF file, each mapped back to the Hugging Face
checkpoint its implementation reads: config.json fields from the metadata, tensor names from GGUF's
through ``gguf.TensorNameMap`` (the table llama.cpp's converter maps with), and the converter's q/k
row permutation undone. The metadata is read through :class:`Meta`, which type-checks each value as
it is asked for (a damaged file is a CheckpointError naming the key, never a TypeError later).

What llama.cpp's converter writes (``conversion/llada.py`` at commit 051139f5, ``conversion/dream.py``
at 7bca1fd9, ``TextModel.set_gguf_parameters`` in ``conversion/base.py`` at 00bd27a6; the diffusion
runner's reading of it in ``examples/diffusion/diffusion-cli.cpp`` at 15ad8f42):

* ``llada`` (``LLaDAModel``): ``{arch}.block_count`` <- n_layers, ``.context_length`` <-
  max_sequence_length, ``.embedding_length`` <- d_model, ``.feed_forward_length`` <- mlp_hidden_size,
  ``.attention.head_count(_kv)`` <- n_heads / n_kv_heads, ``.rope.freq_base``, ``.attention.
  layer_norm_rms_epsilon``, ``.vocab_size``, ``.rope.dimension_count`` (head_dim),
  ``.attention.causal`` false, ``diffusion.shift_logits`` false. q_proj and k_proj rows (weights and
  biases) are permuted per head for llama.cpp's interleaved rope: row ``2i + j`` of a head is HF row
  ``j * hd/2 + i``; k with n_kv_heads heads.
* ``dream`` (``DreamModel``): the same ``TextModel`` keys from the Qwen2 fields, causal false and
  ``tokenizer.ggml.mask_token_id``; no permutation (llama.cpp runs Dream with NEOX rope, as HF does).
  ``diffusion.shift_logits`` is absent, which llama.cpp's diffusion runner reads as shifted.
* ``llada-moe`` (``LLaDAMoEModel`` in ``conversion/llada.py``): the ``TextModel`` keys (``.feed_forward_length``
  <- dense_intermediate_size, ``.expert_count``, ``.expert_used_count``), ``.expert_feed_forward_length``,
  ``tokenizer.ggml.mask_token_id`` 156895, causal and shift_logits false; no permutation (NEOX rope).
  The experts of a layer are stacked into ``blk.N.ffn_{gate,up,down}_exps`` [E, I, D] / [E, D, I]. llama.cpp
  builds every layer routed, full rotary, QK-norm present and no shared expert (its table for this
  architecture has none); a shared expert is read under the names llama.cpp gives other MoEs
  (``ffn_*_shexp``, Qwen2-MoE's), width from the tensor, when a file carries one.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from dlm_backend.errors import CheckpointError

MISSING = object()


class Meta:
    """A GGUF file's key/value metadata, read on demand, each value type-checked as it is asked for."""

    def __init__(self, fields: dict, where: str):
        self._fields, self.where, self._cache = fields, where, {}

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def _raw(self, key: str):
        if key not in self._cache:
            self._cache[key] = _value(self._fields[key], key, self.where)
        return self._cache[key]

    def get(self, key: str, kind: type, default: Any = MISSING) -> Any:
        """``key``'s value as ``kind`` (int, float, str, bool, list); ``default`` when absent (a
        CheckpointError naming the key when there is no default)."""
        if key not in self._fields:
            if default is MISSING:
                raise CheckpointError(f"{self.where}: the GGUF metadata lacks {key!r}, which this architecture "
                                      "needs. Re-convert the model with llama.cpp's convert_hf_to_gguf.py.")
            return default
        value = self._raw(key)
        if kind is int and isinstance(value, list) and value and all(v == value[0] for v in value):
            value = value[0]        # a per-layer array that is one number (llama.cpp allows head counts per layer)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise CheckpointError(f"{self.where}: GGUF metadata {key!r} must be {kind.__name__}, got {value!r:.60}. "
                                  "The file is damaged or not one llama.cpp's converter wrote.")
        return value


def _value(field, key: str, where: str):
    """A reader field as Python: scalars, strings, flat arrays (float32 as its shortest decimal, so
    1e-05 written from config.json reads back as 1e-05, not 9.99999974737875e-06)."""
    types, parts = field.types, field.parts
    try:
        if types[0] == gguf.GGUFValueType.ARRAY:
            if len(types) == 1:
                return []
            if types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(parts[i]).decode("utf-8") for i in field.data]
            if types[-1] == gguf.GGUFValueType.ARRAY:
                return None                             # nested arrays: no key this engine reads has them
            return [_scalar(parts[i][0], types[-1]) for i in field.data]
        if types[0] == gguf.GGUFValueType.STRING:
            return bytes(parts[-1]).decode("utf-8")
        return _scalar(parts[-1][0], types[0])
    except UnicodeDecodeError:
        raise CheckpointError(f"{where}: GGUF metadata {key!r} is not valid UTF-8. The file is damaged; "
                              "re-download it.") from None


def _scalar(v, kind):
    if kind == gguf.GGUFValueType.BOOL:
        return bool(v)
    if kind == gguf.GGUFValueType.FLOAT32:
        return float(str(np.float32(v)))
    if kind == gguf.GGUFValueType.FLOAT64:
        return float(v)
    return int(v)


@dataclass(frozen=True)
class Family:
    """One llama.cpp architecture this engine runs."""

    arch: str                                   # general.architecture
    registry: str                               # our ``architectures`` entry (models/registry.py)
    #: config.json field -> metadata key under ``{arch}.`` (``required`` names those that must be there)
    fields: dict[str, str]
    required: tuple[str, ...]
    vocab_fields: tuple[str, ...]               # config fields the vocabulary size goes into
    tie_field: str                              # set when the file has no output.weight
    hf_tensors: tuple[str, ...]                 # HF tensor names, ``{bid}`` for the layer
    float_only: tuple[str, ...]                 # kept in float (the engine never quantizes them)
    permuted: bool                              # q/k rows interleaved for llama.cpp's rope
    logits_shift: int
    bias_field: str | None = None               # set when the file has q/k/v biases
    #: HF names of whole expert stacks (``{bid}`` for the layer): loaded under the stacked parameter's name
    stacked: tuple[str, ...] = ()
    #: (GGUF template, HF template) pairs the architecture's TensorNameMap lacks
    extra_tensors: tuple[tuple[str, str], ...] = ()
    #: config fields that are not metadata keys: (metadata, config so far, tensor shapes) -> None
    derive: Callable[[Meta, dict, dict], None] | None = None

    @property
    def gguf_arch(self) -> gguf.MODEL_ARCH:
        found = [a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == self.arch]
        if not found:
            raise CheckpointError(f"The installed gguf package ({importlib.metadata.version('gguf')}) predates "
                                  f"llama.cpp's {self.arch!r} architecture; pip install -U gguf.")
        return found[0]


FAMILIES = {
    "llada": Family(
        "llada", "LLaDAModelLM",
        {"d_model": "embedding_length", "n_heads": "attention.head_count", "n_layers": "block_count",
         "mlp_hidden_size": "feed_forward_length", "n_kv_heads": "attention.head_count_kv",
         "max_sequence_length": "context_length", "rope_theta": "rope.freq_base",
         "rms_norm_eps": "attention.layer_norm_rms_epsilon"},
        ("d_model", "n_heads", "n_layers", "mlp_hidden_size"), ("embedding_size", "vocab_size"), "weight_tying",
        ("model.transformer.wte", "model.transformer.ln_f", "model.transformer.ff_out",
         *(f"model.transformer.blocks.{{bid}}.{n}" for n in
           ("attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"))),
        ("model.transformer.wte.weight", "model.transformer.ff_out.weight"), True, 0, "include_qkv_bias"),
    "dream": Family(
        "dream", "DreamModel",
        {"hidden_size": "embedding_length", "num_attention_heads": "attention.head_count",
         "num_hidden_layers": "block_count", "intermediate_size": "feed_forward_length",
         "num_key_value_heads": "attention.head_count_kv", "max_position_embeddings": "context_length",
         "rope_theta": "rope.freq_base", "rms_norm_eps": "attention.layer_norm_rms_epsilon"},
        ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size"), ("vocab_size",),
        "tie_word_embeddings",
        ("model.embed_tokens", "model.norm", "lm_head",
         *(f"model.layers.{{bid}}.{n}" for n in
           ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))),
        ("model.embed_tokens.weight", "lm_head.weight"), False, 1),
}


def _llada_moe(meta: Meta, config: dict, tensors: dict) -> None:
    """What llama.cpp's llada-moe graph fixes rather than reads (every layer routed, rotary over the
    whole head, softmax router without expert bias), and the widths it may leave to the tensors."""
    config.update(moe_layer_freq=[1] * config["num_hidden_layers"], partial_rotary_factor=1.0, clip_qkv=None,
                  moe_router_enable_expert_bias=False, qk_layernorm="blk.0.attn_q_norm.weight" in tensors)
    gate = tensors.get("blk.0.ffn_gate_exps.weight")  # llama.cpp's fallback is n_ff / n_expert_used; this is exact
    if "expert_intermediate_size" not in config and gate and len(gate) == 3:
        config["expert_intermediate_size"] = gate[1]
    shared = tensors.get("blk.0.ffn_gate_shexp.weight")
    # null is the reference's "no shared expert"; an absent field would be its config class's -1
    config.setdefault("shared_expert_intermediate_size", shared[0] if shared else None)


_SHEXP = tuple((gguf.TENSOR_NAMES[t], f"model.layers.{{bid}}.shared_expert.{p}") for t, p in (
    (gguf.MODEL_TENSOR.FFN_GATE_SHEXP, "gate_proj"), (gguf.MODEL_TENSOR.FFN_UP_SHEXP, "up_proj"),
    (gguf.MODEL_TENSOR.FFN_DOWN_SHEXP, "down_proj")))

FAMILIES["llada-moe"] = Family(
    "llada-moe", "LLaDAMoEModelLM",
    {"hidden_size": "embedding_length", "num_attention_heads": "attention.head_count",
     "num_hidden_layers": "block_count", "dense_intermediate_size": "feed_forward_length",
     "num_key_value_heads": "attention.head_count_kv", "max_position_embeddings": "context_length",
     "rope_theta": "rope.freq_base", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
     "num_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
     "expert_intermediate_size": "expert_feed_forward_length",
     "shared_expert_intermediate_size": "expert_shared_feed_forward_length"},
    ("hidden_size", "num_attention_heads", "num_hidden_layers", "num_experts", "num_experts_per_tok", "rope_theta"),
    ("vocab_size",), "tie_word_embeddings",
    ("model.embed_tokens", "model.norm", "lm_head",
     *(f"model.layers.{{bid}}.{n}" for n in
       ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm", "mlp.gate"))),
    ("model.embed_tokens.weight", "lm_head.weight"), False, 0, "attention_bias",
    stacked=tuple(f"model.layers.{{bid}}.mlp.experts.{p}" for p in ("gate_proj", "up_proj", "down_proj")),
    extra_tensors=_SHEXP, derive=_llada_moe)

#: architectures llama.cpp's converter writes that this engine does not run from GGUF, and why
NOT_RUN = {
    "diffusion-gemma": "DiffusionGemma runs from its safetensors release only: its GGUF layout (Gemma 4 tensors "
                       "under llama.cpp's names, a SentencePiece vocabulary) is not mapped back yet",
}


def family_of(meta: Meta) -> Family:
    arch = meta.get("general.architecture", str)
    if arch in FAMILIES:
        return FAMILIES[arch]
    why = f" ({NOT_RUN[arch]})" if arch in NOT_RUN else ""
    raise CheckpointError(f"{meta.where}: GGUF architecture {arch!r:.60} is not supported{why}. Supported GGUF "
                          f"architectures: {', '.join(FAMILIES)}. Use the model's safetensors release instead.")


def hf_config(meta: Meta, fam: Family, tensors: dict[str, tuple[int, ...]]) -> dict:
    """config.json fields for ``fam``'s implementation from the metadata and the tensors' shapes
    (``tensors``: GGUF name -> logical shape)."""
    a = fam.arch
    config: dict[str, Any] = {"architectures": [fam.registry], "model_type": a}
    for field, key in fam.fields.items():
        kind = float if field in ("rope_theta", "rms_norm_eps") else int
        value = meta.get(f"{a}.{key}", kind, MISSING if field in fam.required else None)
        if value is not None:
            config[field] = value
    vocab = meta.get(f"{a}.vocab_size", int, None) or (tensors.get("token_embd.weight") or (None,))[0]
    if vocab is None and "tokenizer.ggml.tokens" in meta:
        vocab = len(meta.get("tokenizer.ggml.tokens", list))
    config.update(dict.fromkeys(fam.vocab_fields, vocab))
    for field, key in (("eos_token_id", "eos_token_id"), ("pad_token_id", "padding_token_id"),
                       ("bos_token_id", "bos_token_id"), ("mask_token_id", "mask_token_id")):
        value = meta.get(f"tokenizer.ggml.{key}", int, None)
        if value is not None:
            config[field] = value
    config[fam.tie_field] = "output.weight" not in tensors
    if fam.bias_field:
        config[fam.bias_field] = "blk.0.attn_q.bias" in tensors
    if fam.derive is not None:
        fam.derive(meta, config, tensors)
    scaling = meta.get(f"{a}.rope.scaling.type", str, "none")
    if scaling != "none" or "rope_freqs.weight" in tensors:       # rope_freqs: llama3-style scaling
        config["rope_scaling"] = {"rope_type": "llama3" if scaling == "none" else scaling}
    _check_heads(meta, fam)
    return config


def _check_heads(meta: Meta, fam: Family) -> None:
    """What the families here cannot take: a head size other than width / heads, partial rotary, and
    a logit alignment other than the family's."""
    a = fam.arch
    heads, width = meta.get(f"{a}.attention.head_count", int), meta.get(f"{a}.embedding_length", int)
    head_dim = width // heads if heads > 0 else 0
    for key in ("attention.key_length", "attention.value_length", "rope.dimension_count"):
        value = meta.get(f"{a}.{key}", int, head_dim)
        if value != head_dim:
            raise CheckpointError(f"{meta.where}: {a}.{key} is {value}, but {fam.registry} needs the head size "
                                  f"embedding_length / head_count = {head_dim}. This variant is not supported.")
    shift = meta.get("diffusion.shift_logits", bool, bool(fam.logits_shift))
    if shift != bool(fam.logits_shift):
        raise CheckpointError(f"{meta.where}: diffusion.shift_logits is {str(shift).lower()}, but {fam.registry} "
                              f"{'reads' if fam.logits_shift else 'never reads'} position i's token from output i - 1. "
                              "The file's metadata contradicts its architecture; re-convert the model.")


def name_map(fam: Family, layers: int) -> dict[str, str]:
    """GGUF tensor name -> HF name, from the converter's own TensorNameMap for ``fam``'s architecture."""
    table = gguf.get_tensor_name_map(fam.gguf_arch, layers)
    out = {}
    for template in fam.hf_tensors:
        for bid in range(layers) if "{bid}" in template else (None,):
            for suffix in (".weight", ".bias"):
                hf = template.format(bid=bid) + suffix
                name = table.get_name(hf, try_suffixes=(".weight", ".bias"))
                if name is not None:
                    out[name] = hf
    for template in fam.stacked:                # the stacked parameter's own name, no ``.weight``
        for bid in range(layers):
            name = table.get_name(template.format(bid=bid) + ".weight", try_suffixes=(".weight",))
            if name is not None:
                out[name] = template.format(bid=bid)
    for ours, hf in fam.extra_tensors:
        for bid in range(layers):
            out[ours.format(bid=bid) + ".weight"] = hf.format(bid=bid) + ".weight"
    return out


def permuted_heads(fam: Family, meta: Meta, hf_name: str) -> int | None:
    """The head count the converter interleaved ``hf_name``'s rows by (None: stored as HF has it).
    Its ``permute(w, n_head, n_head_kv)`` uses n_head_kv for k whenever the counts differ."""
    if not fam.permuted or not hf_name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
        return None
    heads = meta.get(f"{fam.arch}.attention.head_count", int)
    return heads if "q_proj" in hf_name else meta.get(f"{fam.arch}.attention.head_count_kv", int, heads)
