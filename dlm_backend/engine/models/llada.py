"""LLaDA-8B (Base, Instruct, 1.5): OLMo-style "llama" blocks, no biases, untied head.

Module names mirror the checkpoint (``model.transformer.blocks.{i}.q_proj`` ...) so safetensors load
without renaming.
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.layers import RMSNorm, attention, rotate_qk, swiglu
from dlm_backend.engine.models.base import DiffusionLM, ModelArgs, token_ids


class LLaDABlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, qkv_bias: bool):
        super().__init__()
        d, kv = args.hidden_size, args.num_kv_heads * args.head_dim
        self.layer, self.args = layer, args
        self.attn_norm = RMSNorm(d, args.norm_eps)
        self.ff_norm = RMSNorm(d, args.norm_eps)
        self.q_proj = nn.Linear(d, d, bias=qkv_bias)
        self.k_proj = nn.Linear(d, kv, bias=qkv_bias)
        self.v_proj = nn.Linear(d, kv, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_proj = nn.Linear(d, args.intermediate_size, bias=False)   # gate
        self.up_proj = nn.Linear(d, args.intermediate_size, bias=False)
        self.ff_out = nn.Linear(args.intermediate_size, d, bias=False)    # down

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous block's output before its residual add, residual: the running stream (None
        in block 0). Returns this block's (output, residual); the adds happen inside the norms, so the
        kernel path fuses each with its RMSNorm. The sums equal the unfused ``x = x + f(x)`` bitwise."""
        T, hd = x.shape[0], self.args.head_dim
        a, x = self.attn_norm.add_forward(x, residual)           # x: stream after the previous block
        q = self.q_proj(a).view(T, -1, hd)                     # [T, H, hd]
        k = self.k_proj(a).view(T, -1, hd)                     # [T, Hkv, hd]
        v = self.v_proj(a).view(T, -1, hd)
        q, k = rotate_qk(q, k, cos, sin, full_precision=True)
        o = attention(q, k, v, self.layer).reshape(T, -1)     # [T, D]
        f, x = self.ff_norm.add_forward(self.attn_out(o), x)   # x: stream after attention
        return self.ff_out(swiglu(self.ff_proj(f), self.up_proj(f))), x


class LLaDATransformer(nn.Module):
    def __init__(self, args: ModelArgs, qkv_bias: bool):
        super().__init__()
        self.wte = nn.Embedding(args.vocab_size, args.hidden_size)
        self.blocks = nn.ModuleList(LLaDABlock(args, i, qkv_bias) for i in range(args.num_layers))
        self.ln_f = RMSNorm(args.hidden_size, args.norm_eps)
        if not args.tie_word_embeddings:
            self.ff_out = nn.Linear(args.hidden_size, args.vocab_size, bias=False)


class _Holder(nn.Module):
    def __init__(self, transformer: LLaDATransformer):
        super().__init__()
        self.transformer = transformer


class LLaDAModelLM(DiffusionLM):
    logits_shift = 0

    def __init__(self, args: ModelArgs, qkv_bias: bool = False):
        super().__init__(args)
        self.model = _Holder(LLaDATransformer(args, qkv_bias))

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        return ModelArgs(
            vocab_size=c.get("embedding_size") or c["vocab_size"],
            hidden_size=c["d_model"],
            num_layers=c["n_layers"],
            num_heads=c["n_heads"],
            num_kv_heads=c.get("n_kv_heads") or c["n_heads"],
            intermediate_size=c.get("mlp_hidden_size") or c["mlp_ratio"] * c["d_model"],
            max_positions=c.get("max_sequence_length", 4096),
            rope_theta=c.get("rope_theta", 10000.0),
            norm_eps=c.get("rms_norm_eps", 1e-5),
            mask_token_id=c.get("mask_token_id", 126336),
            eos_token_ids=token_ids(c.get("eos_token_id")),
            pad_token_id=c.get("pad_token_id"),
            bos_token_id=c.get("bos_token_id"),
            tie_word_embeddings=bool(c.get("weight_tying", False)),
        )

    @classmethod
    def from_config(cls, c: dict) -> "LLaDAModelLM":
        return cls(cls.args_from_config(c), qkv_bias=bool(c.get("include_qkv_bias") or c.get("include_bias")))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        cos, sin = self.rotary.lookup(positions)               # [T, 1, hd]
        x, residual = t.wte(input_ids), None                   # [T, D]
        for block in t.blocks:
            x, residual = block(x, residual, cos, sin)
        return residual + x

    def head(self) -> tuple[RMSNorm, torch.Tensor]:
        t = self.model.transformer
        return t.ln_f, (t.wte.weight if self.args.tie_word_embeddings else t.ff_out.weight)
