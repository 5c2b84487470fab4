"""Dream-v0 (and Dream-architecture derivatives): Qwen2 layers with q/k/v biases and GQA.

Dream keeps its autoregressive initialisation's alignment: the prediction for position i is read
from the output at i - 1 (``logits_shift = 1``). RoPE runs in the model dtype with cos/sin cast to
it, unlike LLaDA's fp32 rotation.
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


class DreamAttention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        d, heads, kv, hd = args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim
        self.layer, self.head_dim = layer, hd
        self.q_proj = ColumnLinear(d, d, bias=True, what="the attention heads' width")
        self.k_proj = kv_linear(d, kv, heads, hd, bias=True)
        self.v_proj = kv_linear(d, kv, heads, hd, bias=True)
        self.o_proj = RowLinear(d, d, bias=False, what="the attention heads' width")

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated q [T, H, hd], k and v [T, Hkv, hd]: every product and elementwise op before the
        attention itself, in one piece (a unit ``torch.compile`` can take whole)."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, -1, self.head_dim)          # [T, H, hd]
        k = self.k_proj(x).view(T, -1, self.head_dim)          # [T, Hkv, hd]
        v = self.v_proj(x).view(T, -1, self.head_dim)
        q, k = rotate_qk(q, k, cos, sin, full_precision=False)
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        return self.o_proj(attention(q, k, v, self.layer).reshape(x.shape[0], -1))


class DreamLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.self_attn = DreamAttention(args, layer)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size)

    def forward(self, x, residual, cos, sin):
        """(previous layer's output, residual stream or None) -> (this layer's output, stream); the
        residual adds run inside the norms (fused on the kernel path), bitwise equal to unfused."""
        a, x = self.input_layernorm.add_forward(x, residual)
        f, x = self.post_attention_layernorm.add_forward(self.self_attn(a, cos, sin), x)
        return self.mlp(f), x


class DreamBase(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DreamLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)


class DreamModel(DecoderStackLM):
    tensor_parallel = True                   # built from layers/parallel.py
    logits_shift = 1

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = DreamBase(args)
        if not args.tie_word_embeddings:
            self.lm_head = VocabLinear(args.hidden_size, args.vocab_size)

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        r = ConfigReader(c)
        r.rope_scaling()
        if c.get("hidden_act", "silu") != "silu":        # the reference MLP is ACT2FN[hidden_act]
            raise CheckpointError(f"config.json: hidden_act {c.get('hidden_act')!r:.40} is not supported (the "
                                  "MLPs here are SwiGLU: silu).")
        vocab = r.int("vocab_size", high=MAX_VOCAB)
        hidden, heads = r.int("hidden_size"), r.int("num_attention_heads", high=MAX_HEADS)
        kv_heads = r.int("num_key_value_heads", default=heads, high=MAX_HEADS)
        r.heads(hidden, heads, kv_heads)
        return ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_layers=r.int("num_hidden_layers", high=MAX_LAYERS),
            num_heads=heads, num_kv_heads=kv_heads, intermediate_size=r.int("intermediate_size"),
            max_positions=r.int("max_position_embeddings", default=32768, high=MAX_POSITIONS),
            rope_theta=r.float("rope_theta", default=10000.0), norm_eps=r.float("rms_norm_eps", default=1e-6, high=1),
            mask_token_id=r.int("mask_token_id", default=min(151666, vocab - 1), low=0, high=vocab - 1),
            eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
            bos_token_id=r.token_id("bos_token_id", vocab),
            tie_word_embeddings=r.bool("tie_word_embeddings"))

    @classmethod
    def from_config(cls, c: dict) -> "DreamModel":
        return cls(cls.args_from_config(c))

