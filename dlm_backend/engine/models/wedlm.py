"""WeDLM (Tencent, ``WeDLMForCausalLM``): a Qwen2.5 or Qwen3 model continued as a diffusion model
that keeps standard causal attention.

The layers are the reference ``hf_compat/modeling_wedlm.py``'s: separate q/k/v/o projections, q/k/v
biased with ``attention_bias`` (o never), an optional per-head QK-norm before a full (NeoX) rotary
(``qk_norm``: WeDLM-8B, Qwen3-based), SwiGLU, untied head unless ``tie_word_embeddings``. Its
decoding (engine/requests/wedlm_sequence.py, samplers/wedlm.py) appends blocks of masks after the
prompt and runs each pass over the sequence reordered so that every committed token precedes every
mask, each keeping its own rotary position: a causal model then predicts each mask from everything
committed. Module names mirror the checkpoint (``model.layers.{i}.self_attn.q_proj`` ...).
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.layers import RMSNorm, attention, rotate_qk
from dlm_backend.engine.layers.mlp import GatedMLP
from dlm_backend.engine.layers.parallel import ColumnLinear, RowLinear, VocabEmbedding, VocabLinear, kv_linear
from dlm_backend.engine.models.base import DecoderStackLM, ModelArgs
from dlm_backend.engine.models.config_reader import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, ConfigReader
from dlm_backend.errors import CheckpointError

#: the mask id when config.json names none: the official engine's fallback (wedlm/engine/model_runner.py)
ENGINE_MASK_ID = 151665


class WeDLMAttention(nn.Module):
    """q/k/v (biased with ``attention_bias``), o unbiased, optional q_norm/k_norm, full rotary."""

    def __init__(self, args: ModelArgs, layer: int, bias: bool, qk_norm: bool):
        super().__init__()
        d, hd, heads, kv = args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads
        self.layer, self.hd = layer, hd
        self.q_proj = ColumnLinear(d, heads * hd, bias=bias, what="the attention heads' width")
        self.k_proj = kv_linear(d, kv, heads, hd, bias=bias)
        self.v_proj = kv_linear(d, kv, heads, hd, bias=bias)
        self.o_proj = RowLinear(heads * hd, d, bias=False, what="the attention heads' width")
        self.q_norm = RMSNorm(hd, args.norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(hd, args.norm_eps) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        q = self.q_proj(x).view(T, -1, self.hd)                        # [T, H, hd]
        k = self.k_proj(x).view(T, -1, self.hd)                        # [T, Hkv, hd]
        v = self.v_proj(x).view(T, -1, self.hd)
        if self.q_norm is not None:                                     # Qwen3: QK-norm before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate_qk(q, k, cos, sin, full_precision=False)          # cos/sin cast to the model dtype
        return self.o_proj(attention(q, k, v, self.layer).reshape(T, -1))


class WeDLMDecoderLayer(nn.Module):
    """Pre-norm attention, then the SwiGLU MLP."""

    def __init__(self, args: ModelArgs, layer: int, bias: bool, qk_norm: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.self_attn = WeDLMAttention(args, layer, bias, qk_norm)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size)

    def forward(self, x, residual, cos, sin):
        """(previous layer's output, residual stream or None) -> (this layer's output, stream)."""
        a, x = self.input_layernorm.add_forward(x, residual)
        f, x = self.post_attention_layernorm.add_forward(self.self_attn(a, cos, sin), x)
        return self.mlp(f), x


class WeDLMModel(nn.Module):
    """The checkpoint's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs, bias: bool, qk_norm: bool):
        super().__init__()
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(WeDLMDecoderLayer(args, i, bias, qk_norm) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)


class WeDLMForCausalLM(DecoderStackLM):
    """WeDLM-7B / 8B (Base and Instruct): causal layers decoded by topological reordering."""

    tensor_parallel = True                   # built from layers/parallel.py
    logits_shift = 0                         # a mask's prediction is read at its own row
    schedule = "wedlm"
    # The reference generate_wedlm's parallel mode (confidence_threshold 0.9: every mask at least that
    # confident, else the most confident one; its 0 default is one token a pass, remasking
    # "low_confidence" here) in blocks of 16, the official engine's window (example.py's
    # wedlm_window_size). The official engine's own entropy rule is another decoder, not this one.
    sampling_defaults = {"sampler": "wedlm", "remasking": "low_confidence_dynamic", "threshold": 0.9,
                         "block_length": 16, "cache": "prefix"}

    def __init__(self, args: ModelArgs, attention_bias: bool = True, qk_norm: bool = False):
        super().__init__(args)
        self.model = WeDLMModel(args, attention_bias, qk_norm)
        if not args.tie_word_embeddings:
            self.lm_head = VocabLinear(args.hidden_size, args.vocab_size)

    @staticmethod
    def _refuse_unsupported(r: ConfigReader, layers: int) -> None:
        r.rope_scaling()
        if r.bool("use_sliding_window"):
            raise CheckpointError("config.json: use_sliding_window: true asks for sliding-window attention, which "
                                  "this engine does not implement for WeDLM (no released WeDLM checkpoint uses it). "
                                  "Set it to false.")
        kinds = r.config.get("layer_types")
        if kinds is not None and (not isinstance(kinds, list) or len(kinds) != layers
                                  or any(k != "full_attention" for k in kinds)):
            raise CheckpointError(f"config.json: layer_types must list 'full_attention' for each of the {layers} "
                                  f"layers (sliding layers are not implemented for WeDLM), got {kinds!r:.80}. "
                                  "Remove layer_types or fix it.")
        if r.config.get("hidden_act", "silu") != "silu":     # the reference MLP is ACT2FN[hidden_act]
            raise CheckpointError(f"config.json: hidden_act {r.config.get('hidden_act')!r:.40} is not supported "
                                  "(the MLPs here are SwiGLU: silu).")

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        """The reference WeDLMConfig's fields with its defaults (``configuration_wedlm.py``)."""
        r = ConfigReader(c)
        layers = r.int("num_hidden_layers", default=32, high=MAX_LAYERS)
        cls._refuse_unsupported(r, layers)
        vocab = r.int("vocab_size", default=151936, high=MAX_VOCAB)
        hidden = r.int("hidden_size", default=4096)
        heads = r.int("num_attention_heads", default=32, high=MAX_HEADS)
        kv_heads = r.int("num_key_value_heads", default=heads, high=MAX_HEADS)
        head_dim = r.int("head_dim", default=None)                     # None: hidden / heads, as the reference
        r.heads(heads * head_dim if head_dim else hidden, heads, kv_heads)
        return ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
            intermediate_size=r.int("intermediate_size", default=22016),
            max_positions=r.int("max_position_embeddings", default=32768, high=MAX_POSITIONS),
            rope_theta=r.float("rope_theta", default=10000.0), norm_eps=r.float("rms_norm_eps", default=1e-6, high=1),
            # config.json's, else the official engine's fallback where the vocabulary holds it, else the
            # tokenizer's mask token (generate_wedlm itself takes it as an argument)
            mask_token_id=r.int("mask_token_id", default=ENGINE_MASK_ID if vocab > ENGINE_MASK_ID else None,
                                low=0, high=vocab - 1),
            eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
            bos_token_id=r.token_id("bos_token_id", vocab),
            tie_word_embeddings=r.bool("tie_word_embeddings"), explicit_head_dim=head_dim)

    @classmethod
    def from_config(cls, c: dict) -> "WeDLMForCausalLM":
        r = ConfigReader(c)
        # The reference's defaults: attention_bias True (Qwen2.5), qk_norm False.
        return cls(cls.args_from_config(c), r.bool("attention_bias", default=True), r.bool("qk_norm"))

