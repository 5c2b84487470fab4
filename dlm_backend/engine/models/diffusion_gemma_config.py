"""DiffusionGemma's config.json, as transformers 5.x writes and reads it, checked before anything is built.

The text model's fields sit under ``text_config`` (a flat config is read too). Layers are
``sliding_attention`` or ``full_attention`` (``layer_types``; by default five sliding to one full,
and the last layer is always full, as the reference forces it). Full layers have their own head
size and key/value heads, written either as the official checkpoints write them
(``global_head_dim``, ``num_global_key_value_heads`` gated by ``attention_k_eq_v``) or as
``save_pretrained`` writes them (``per_layer_config: {"<layer>": {"head_dim", "num_key_value_heads"}}``,
which also drops ``final_logit_softcapping``: its class default, 30). ``canvas_length`` is the block.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlm_backend.engine.models.base import ModelArgs
from dlm_backend.engine.models.config_reader import (MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, MAX_WIDTH,
                                                     ConfigReader)
from dlm_backend.errors import CheckpointError

MAX_EXPERTS = 4096
# The reference config class's defaults, used where a config.json leaves a field out.
SLIDING_WINDOW = 512
SOFTCAP = 30.0
CANVAS = 256
SLIDING_ROPE = {"rope_type": "default", "rope_theta": 10_000.0}
FULL_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}


@dataclass(frozen=True)
class GemmaArgs:
    """What a DiffusionGemma config says beyond :class:`ModelArgs`."""

    sliding: tuple[bool, ...]          # per layer: a sliding-window layer (else full attention)
    sliding_window: int
    full_theta: float
    full_rotary_factor: float          # proportional RoPE: the fraction of a full head's frequencies that turn
    softcap: float
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    attention_bias: bool


def _text(c: dict) -> dict:
    text = c.get("text_config", c)
    if not isinstance(text, dict):
        raise CheckpointError("config.json: text_config must be an object. Re-download the checkpoint.")
    return text


def _layer_types(r: ConfigReader, layers: int) -> tuple[bool, ...]:
    types = r.config.get("layer_types")
    if types is None:
        types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    if (not isinstance(types, list) or len(types) != layers
            or any(t not in ("sliding_attention", "full_attention") for t in types)):
        raise CheckpointError(f"config.json: text_config.layer_types must list {layers} entries, each "
                              "'sliding_attention' or 'full_attention'. Fix config.json.")
    return tuple(t == "sliding_attention" for t in types[:-1]) + (False,)     # the last layer is always full


def _rope(r: ConfigReader, kind: str, default: dict) -> dict:
    params = (r.config.get("rope_parameters") or {}).get(kind, default)
    if not isinstance(params, dict) or params.get("rope_type", default["rope_type"]) != default["rope_type"]:
        raise CheckpointError(f"config.json: rope_parameters.{kind} {params!r:.80} is not supported; this engine "
                              f"implements DiffusionGemma's {default['rope_type']!r} RoPE for these layers.")
    return {**default, **params}


def _full_layer_kv(r: ConfigReader, sliding: tuple[bool, ...], head_dim: int, kv_heads: int) -> dict[int, tuple]:
    """(Hkv, head_dim) of each full layer, from either form of the config."""
    per_layer = r.config.get("per_layer_config")
    if per_layer is not None:
        if not isinstance(per_layer, dict):
            raise CheckpointError("config.json: per_layer_config must map layer indices to overrides.")
        out = {}
        for key, over in per_layer.items():
            layer = int(key) if str(key).isdigit() else -1
            if not 0 <= layer < len(sliding) or not isinstance(over, dict):
                raise CheckpointError(f"config.json: per_layer_config key {key!r} is not a layer index in "
                                      f"[0, {len(sliding)}). Fix config.json.")
            sub = ConfigReader(over, f"config.json per_layer_config[{key}]")
            out[layer] = (sub.int("num_key_value_heads", default=kv_heads, high=MAX_HEADS),
                          sub.int("head_dim", default=head_dim))
        return out
    global_dim = r.int("global_head_dim", default=512)
    # The reference applies num_global_key_value_heads only where attention_k_eq_v says so.
    global_kv = r.int("num_global_key_value_heads", default=None, high=MAX_HEADS)
    heads = global_kv if global_kv is not None and r.bool("attention_k_eq_v", default=True) else kv_heads
    return {i: (heads, global_dim) for i, s in enumerate(sliding) if not s}


def read_config(c: dict) -> tuple[ModelArgs, GemmaArgs]:
    """ModelArgs and GemmaArgs of a DiffusionGemma config.json; a CheckpointError names a bad field."""
    r = ConfigReader(_text(c), "config.json text_config")
    if r.config.get("hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"config.json: hidden_activation {r.config.get('hidden_activation')!r:.40} is not "
                              "supported (DiffusionGemma's MLPs are tanh-GELU gated).")
    if r.config.get("use_bidirectional_attention") == "all":
        raise CheckpointError("config.json: use_bidirectional_attention 'all' (a bidirectional encoder with a "
                              "halved window) is not implemented; DiffusionGemma's text encoder is causal.")
    if not ConfigReader(c).bool("tie_word_embeddings", default=True):
        raise CheckpointError("config.json: tie_word_embeddings false is not supported; DiffusionGemma's head is "
                              "its embedding (and its encoder and decoder share every weight).")
    vocab = r.int("vocab_size", high=MAX_VOCAB)
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads", high=MAX_HEADS)
    kv_heads = r.int("num_key_value_heads", default=heads, high=MAX_HEADS)
    head_dim = r.int("head_dim", default=256)
    layers = r.int("num_hidden_layers", high=MAX_LAYERS)
    sliding = _layer_types(r, layers)
    full = _full_layer_kv(r, sliding, head_dim, kv_heads)
    shapes = tuple(full.get(i, (kv_heads, head_dim)) if not s else (kv_heads, head_dim) for i, s in enumerate(sliding))
    for hkv, dim in shapes:
        if heads % hkv or dim % 2:
            raise CheckpointError(f"config.json: {hkv} key/value heads of {dim} do not fit {heads} query heads "
                                  "(a divisor, and an even head size). Fix config.json.")
    slide, glob = _rope(r, "sliding_attention", SLIDING_ROPE), _rope(r, "full_attention", FULL_ROPE)
    theta = ConfigReader(slide, "rope_parameters.sliding_attention").float("rope_theta")
    g = ConfigReader(glob, "rope_parameters.full_attention")
    experts = r.int("num_experts", high=MAX_EXPERTS)
    gemma = GemmaArgs(
        sliding=sliding, sliding_window=r.int("sliding_window", default=SLIDING_WINDOW, high=MAX_POSITIONS),
        full_theta=g.float("rope_theta"), full_rotary_factor=g.float("partial_rotary_factor", high=1.0),
        softcap=r.float("final_logit_softcapping", default=SOFTCAP, high=1e6),
        num_experts=experts, top_k=r.int("top_k_experts", high=experts),
        moe_intermediate_size=r.int("moe_intermediate_size", high=MAX_WIDTH),
        attention_bias=r.bool("attention_bias"))
    args = ModelArgs(
        vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        intermediate_size=r.int("intermediate_size"),
        max_positions=r.int("max_position_embeddings", default=131_072, high=MAX_POSITIONS),
        rope_theta=theta, norm_eps=r.float("rms_norm_eps", default=1e-6, high=1),
        mask_token_id=None,                 # uniform noise: no mask token
        eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
        bos_token_id=r.token_id("bos_token_id", vocab), tie_word_embeddings=True, explicit_head_dim=head_dim,
        block_size=ConfigReader(c).int("canvas_length", default=CANVAS, high=MAX_POSITIONS), layer_kv=shapes)
    return args, gemma
