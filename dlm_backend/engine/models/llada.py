"""LLaDA-8B (Base, Instruct, 1.5): OLMo-style "llama" blocks, no biases, untied head.

Module names mirror the checkpoint (``model.transformer.blocks.{i}.q_proj`` ...) so safetensors load
without renaming.
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.layers import RMSNorm, attention, rotate_qk, swiglu
from dlm_backend.engine.layers.parallel import ColumnLinear, RowLinear, VocabEmbedding, VocabLinear, kv_linear
from dlm_backend.engine.models.base import DiffusionLM, ModelArgs
from dlm_backend.engine.models.config_reader import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, ConfigReader
from dlm_backend.errors import CheckpointError


class LLaDABlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, qkv_bias: bool):
        super().__init__()
        d, heads, kv, hd = args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim
        width = args.intermediate_size
        self.layer, self.args = layer, args
        self.attn_norm = RMSNorm(d, args.norm_eps)
        self.ff_norm = RMSNorm(d, args.norm_eps)
        # Column-parallel q/k/v and gate/up, row-parallel out/down (one all-reduce each) under TP.
        self.q_proj = ColumnLinear(d, d, bias=qkv_bias, what="the attention heads' width")
        self.k_proj = kv_linear(d, kv, heads, hd, bias=qkv_bias)
        self.v_proj = kv_linear(d, kv, heads, hd, bias=qkv_bias)
        self.attn_out = RowLinear(d, d, bias=False, what="the attention heads' width")
        self.ff_proj = ColumnLinear(d, width, bias=False, what="the MLP width")   # gate
        self.up_proj = ColumnLinear(d, width, bias=False, what="the MLP width")
        self.ff_out = RowLinear(width, d, bias=False, what="the MLP width")       # down

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
        self.wte = VocabEmbedding(args.vocab_size, args.hidden_size)
        self.blocks = nn.ModuleList(LLaDABlock(args, i, qkv_bias) for i in range(args.num_layers))
        self.ln_f = RMSNorm(args.hidden_size, args.norm_eps)
        if not args.tie_word_embeddings:
            self.ff_out = VocabLinear(args.hidden_size, args.vocab_size)


class _Holder(nn.Module):
    def __init__(self, transformer: LLaDATransformer):
        super().__init__()
        self.transformer = transformer


class LLaDAModelLM(DiffusionLM):
    tensor_parallel = True                   # built from layers/parallel.py
    logits_shift = 0

    def __init__(self, args: ModelArgs, qkv_bias: bool = False):
        super().__init__(args)
        self.model = _Holder(LLaDATransformer(args, qkv_bias))

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        r = ConfigReader(c)
        r.rope_scaling()
        # The reference (modeling_llada.py) rotates only with rope: true and otherwise adds a learned
        # position table (wpe) or ALiBi; every block here rotates, so either of those loaded as RoPE.
        if not r.bool("rope", default=True) or r.bool("alibi"):
            raise CheckpointError("config.json: rope: false or alibi: true asks for learned or ALiBi positions; "
                                  "this engine implements LLaDA with rope: true only (the released checkpoints).")
        if r.bool("include_bias"):
            # The reference's OLMo option: biases on q/k/v, attn_out, ff_proj, up_proj, ff_out and the
            # head; no released LLaDA checkpoint sets it (include_qkv_bias, the q/k/v ones, is supported).
            raise CheckpointError("config.json: include_bias: true puts a bias on every linear layer, which no "
                                  "released LLaDA checkpoint uses and this engine does not implement. Use a "
                                  "checkpoint with include_bias: false (include_qkv_bias is supported).")
        vocab = r.int("embedding_size", "vocab_size", high=MAX_VOCAB)
        hidden, heads = r.int("d_model"), r.int("n_heads", high=MAX_HEADS)
        kv_heads = r.int("n_kv_heads", default=heads, high=MAX_HEADS)
        r.heads(hidden, heads, kv_heads)
        mlp = c.get("mlp_hidden_size") or r.int("mlp_ratio", high=64) * hidden
        return ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_layers=r.int("n_layers", high=MAX_LAYERS), num_heads=heads,
            num_kv_heads=kv_heads, intermediate_size=r.int("mlp_hidden_size", default=mlp),
            max_positions=r.int("max_sequence_length", default=4096, high=MAX_POSITIONS),
            rope_theta=r.float("rope_theta", default=10000.0), norm_eps=r.float("rms_norm_eps", default=1e-5, high=1),
            mask_token_id=r.int("mask_token_id", default=126336, low=0, high=vocab - 1),
            eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
            bos_token_id=r.token_id("bos_token_id", vocab),
            # the reference ModelConfig's default is tied (weight_tying = True); the releases say false
            tie_word_embeddings=r.bool("weight_tying", default=True))

    @classmethod
    def from_config(cls, c: dict) -> "LLaDAModelLM":
        r = ConfigReader(c)
        return cls(cls.args_from_config(c), qkv_bias=r.bool("include_qkv_bias"))

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
