"""Nemotron-Labs-Diffusion (NVIDIA, 3B / 8B / 14B, ``NemotronLabsDiffusionModel``): one Ministral-3
model trained jointly as an autoregressive and a diffusion LM, decoded three ways.

The layers are Ministral 3's (``encoder.`` in the checkpoint): q/k/v/o without QK-norm, GQA, full
NeoX rotary with YaRN frequencies (``rope_parameters``), and Llama 4's query temperature: after the
rotation q is scaled by ``1 + beta * ln(1 + floor(pos / original_max))``, which is 1 below
``original_max_position_embeddings`` (16,384 in the released configs) and grows past it. SwiGLU MLP,
RMSNorm, an untied ``diffusion_head``. The prediction for slot i is read at i in a diffusion pass and
at i - 1 in a causal one (Pass.shift).

Attention is causal in the autoregressive passes (the prompt's prefill, every finished block's
keys, self-speculation's verify) and bidirectional over the cache and the block in a denoising
pass: the reference flips its layers' ``diffusion_lm`` switch between them. How the three modes
schedule those passes is engine/requests/causal_block_sequence.py, their commit rules
samplers/nemotron.py.
"""

from __future__ import annotations

import torch
from torch import nn

from dlm_backend.engine.layers import RMSNorm, RotaryTable, attention, rotate_qk
from dlm_backend.engine.layers.mlp import GatedMLP
from dlm_backend.engine.layers.parallel import ColumnLinear, RowLinear, VocabEmbedding, VocabLinear, kv_linear
from dlm_backend.engine.layers.rotary import yarn_rope
from dlm_backend.engine.models.base import DiffusionLM, ModelArgs
from dlm_backend.engine.models.config_reader import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, ConfigReader
from dlm_backend.errors import CheckpointError

BLOCK = 32                  # the released configs' block_size (and the reference generate()'s usual block_length)


class NemotronAttention(nn.Module):
    """Ministral 3 attention: q/k/v/o (biased only with attention_bias), rotary, then the query scale."""

    def __init__(self, args: ModelArgs, layer: int, bias: bool):
        super().__init__()
        d, hd, heads, kv = args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads
        self.layer, self.hd = layer, hd
        self.q_proj = ColumnLinear(d, heads * hd, bias=bias, what="the attention heads' width")
        self.k_proj = kv_linear(d, kv, heads, hd, bias=bias)
        self.v_proj = kv_linear(d, kv, heads, hd, bias=bias)
        self.o_proj = RowLinear(heads * hd, d, bias=bias, what="the attention heads' width")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_scale: torch.Tensor | None):
        T = x.shape[0]
        q = self.q_proj(x).view(T, -1, self.hd)                       # [T, H, hd]
        k = self.k_proj(x).view(T, -1, self.hd)                       # [T, Hkv, hd]
        v = self.v_proj(x).view(T, -1, self.hd)
        q, k = rotate_qk(q, k, cos, sin, full_precision=False)         # cos/sin cast to the model dtype
        if q_scale is not None:
            q = q * q_scale.to(q.dtype)                                 # [T, 1, 1]
        return self.o_proj(attention(q, k, v, self.layer).reshape(T, -1))


class NemotronLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, bias: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.self_attn = NemotronAttention(args, layer, bias)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size)

    def forward(self, x, residual, cos, sin, q_scale):
        """(previous layer's output, residual stream or None) -> (this layer's output, stream)."""
        a, x = self.input_layernorm.add_forward(x, residual)
        f, x = self.post_attention_layernorm.add_forward(self.self_attn(a, cos, sin, q_scale), x)
        return self.mlp(f), x


class NemotronEncoder(nn.Module):
    """The checkpoint's ``encoder.`` prefix (a Ministral3Model): embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs, bias: bool):
        super().__init__()
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(NemotronLayer(args, i, bias) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)


class NemotronLabsDiffusionModel(DiffusionLM):
    """Nemotron-Labs-Diffusion: autoregressive, block-diffusion and self-speculative decoding of one model."""

    tensor_parallel = True
    logits_shift = 0                         # denoising passes; causal passes read one row back (Pass.shift)
    schedule = "causal_block"
    # Block diffusion in blocks of config.json's block_size, each pass committing what is at least
    # 0.9 confident (else the most confident slot): the reference generate()'s threshold mode.
    sampling_defaults = {"sampler": "nemotron", "remasking": "low_confidence_dynamic", "threshold": 0.9,
                         "cache": "prefix"}

    def __init__(self, args: ModelArgs, rope: dict, attention_bias: bool = False):
        super().__init__(args)
        self.rope = rope
        self.encoder = NemotronEncoder(args, attention_bias)
        self.diffusion_head = VocabLinear(args.hidden_size, args.vocab_size)

    @classmethod
    def read_config(cls, c: dict) -> tuple[ModelArgs, dict, bool]:
        """``(args, rope parameters, attention_bias)`` as the reference's config class reads them."""
        r = ConfigReader(c)
        if c.get("dlm_paradigm", "bidirectional") != "bidirectional":
            # block_diff is a training-time layout (flex attention over a doubled sequence); the
            # released checkpoints are "bidirectional", which all three decoders run.
            raise CheckpointError(f"config.json: dlm_paradigm {c.get('dlm_paradigm')!r:.40} is not supported; the "
                                  "released Nemotron-Labs-Diffusion checkpoints say \"bidirectional\".")
        if c.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"config.json: hidden_act {c.get('hidden_act')!r:.40} is not supported (the "
                                  "MLPs here are SwiGLU: silu).")
        if r.bool("mlp_bias") or c.get("sliding_window") is not None:
            raise CheckpointError("config.json asks for MLP biases or sliding-window attention, which no released "
                                  "Nemotron-Labs-Diffusion checkpoint uses and this engine does not implement.")
        vocab = r.int("vocab_size", high=MAX_VOCAB)
        hidden, heads = r.int("hidden_size"), r.int("num_attention_heads", high=MAX_HEADS)
        kv_heads = r.int("num_key_value_heads", default=heads, high=MAX_HEADS)
        if heads % kv_heads:
            raise CheckpointError(f"config.json: num_key_value_heads must divide the {heads} attention heads, "
                                  f"got {kv_heads}. Fix the file or re-download the checkpoint.")
        head_dim = r.int("head_dim", default=None) or hidden // heads
        rope = cls.rope_parameters(c)
        args = ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_layers=r.int("num_hidden_layers", high=MAX_LAYERS),
            num_heads=heads, num_kv_heads=kv_heads, intermediate_size=r.int("intermediate_size"),
            max_positions=r.int("max_position_embeddings", default=262144, high=MAX_POSITIONS),
            rope_theta=rope["rope_theta"], norm_eps=r.float("rms_norm_eps", default=1e-5, high=1),
            mask_token_id=r.int("mask_token_id", default=None, low=0, high=vocab - 1),
            eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
            bos_token_id=r.token_id("bos_token_id", vocab), tie_word_embeddings=False,
            explicit_head_dim=head_dim if head_dim != hidden // heads else None,
            block_size=r.int("block_size", default=BLOCK, high=MAX_POSITIONS))
        return args, rope, r.bool("attention_bias")

    @staticmethod
    def rope_parameters(c: dict) -> dict:
        """``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta`` (older files), checked:
        the default rotary or YaRN, with Llama 4's query scale when ``llama_4_scaling_beta`` is set."""
        where = "rope_parameters" if "rope_parameters" in c else "rope_scaling"
        given = c.get(where) or {}
        if not isinstance(given, dict):
            raise CheckpointError(f"config.json: {where} must be an object, got {given!r:.60}.")
        rope = {"rope_theta": c.get("rope_theta", 1e6), **given}
        r = ConfigReader(rope, where=f"config.json {where}")
        kind = rope.get("rope_type") or rope.get("type") or "default"
        if kind not in ("default", "yarn"):
            raise CheckpointError(f"config.json: {where} rope_type {kind!r:.40} is not supported (default and yarn "
                                  "are).")
        out = {"rope_type": kind, "rope_theta": r.float("rope_theta"),
               "llama_4_scaling_beta": r.float("llama_4_scaling_beta", default=0.0, low=0.0, low_open=False,
                                               high=100.0) if rope.get("llama_4_scaling_beta") is not None else 0.0}
        if kind == "yarn" or out["llama_4_scaling_beta"]:
            out["original_max_position_embeddings"] = r.int("original_max_position_embeddings", high=MAX_POSITIONS)
        if kind == "yarn":
            out["factor"] = r.float("factor", high=1e4)
            for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
                out[name] = r.float(name, default=default, high=1e4) if rope.get(name) else default
            for name in ("mscale", "mscale_all_dim", "attention_factor"):
                out[name] = r.float(name, default=None, high=1e4) if rope.get(name) is not None else None
            out["truncate"] = r.bool("truncate", default=True)
        return out

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        return cls.read_config(c)[0]

    @classmethod
    def from_config(cls, c: dict) -> "NemotronLabsDiffusionModel":
        args, rope, bias = cls.read_config(c)
        return cls(args, rope, bias)

    def setup(self, device: torch.device | str) -> None:
        a, rope = self.args, self.rope
        inv_freq, factor = None, 1.0
        if rope["rope_type"] == "yarn":
            inv_freq, factor = yarn_rope(
                a.head_dim, rope["rope_theta"], rope["factor"], rope["original_max_position_embeddings"],
                rope["beta_fast"], rope["beta_slow"], rope["mscale"], rope["mscale_all_dim"],
                rope["attention_factor"], rope["truncate"])
        self.rotary = RotaryTable(a.head_dim, a.rope_theta, a.max_positions, device, inv_freq=inv_freq,
                                  attention_factor=factor)

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Llama 4's per-position query temperature ``[T, 1, 1]`` (None without it), in fp32."""
        beta = self.rope["llama_4_scaling_beta"]
        if not beta:
            return None
        span = self.rope["original_max_position_embeddings"]
        return (1 + beta * torch.log(1 + torch.floor(positions.float() / span)))[:, None, None]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary.lookup(positions)                    # [T, 1, hd]
        q_scale = self.query_scale(positions)
        x, residual = self.encoder.embed_tokens(input_ids), None    # [T, D]
        for layer in self.encoder.layers:
            x, residual = layer(x, residual, cos, sin, q_scale)
        return residual + x

    def head(self) -> tuple[RMSNorm, torch.Tensor]:
        return self.encoder.norm, self.diffusion_head.weight
