"""LLaDA-MoE (``LLaDAMoEModelLM``, inclusionAI/LLaDA-MoE-7B-A1B-Base and -Instruct, 7B total, 1B
active): LLaDA's full-sequence masked diffusion (its samplers and caches) over OLMoE-style layers.

Pre-norm layers: q/k/v/o projections (biases with ``attention_bias``), per-head QK-norm
(``qk_layernorm``), rotary over ``int(head_dim * partial_rotary_factor)`` dims, bidirectional
attention; then a dense SwiGLU (``moe_layer_freq[i] == 0``) or a routed MoE plus an optional shared
expert. The router is the reference's (HF ``modeling_lladamoe.py``): softmax over every expert in
fp32, the ``expert_bias`` buffer added to the probabilities when ``moe_router_enable_expert_bias``,
and the top-k of those (biased) values are both the choice and the weights, never renormalised.
The reference reads but never uses ``norm_topk_prob`` (it hard-codes False),
``moe_router_score_function`` (always softmax), ``routed_scaling_factor`` and the router group
fields; so does this module. The experts' weighted sum accumulates in fp32 (layers/moe.py), where
the reference casts the weights to the model dtype and sums in it: the same ascending-expert order
in float32 (llada-moe-tiny's logits, up to 10.7, agree within 6e-6), one rounding apart in bfloat16. Module names mirror the checkpoint (``model.layers.{i}.self_attn.q_proj``
...); per-expert tensors load into stacked weights.

The mask id is not in config.json: the reference ``generate()`` passes ``mask_id=156895``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlm_backend.engine.layers import RMSNorm, attention, rotate_qk
from dlm_backend.engine.layers.mlp import GatedMLP
from dlm_backend.engine.layers.parallel import ColumnLinear, RowLinear, VocabEmbedding, VocabLinear, kv_linear
from dlm_backend.engine.layers.routers import StackedExperts, softmax_topk, stacked_expert_name
from dlm_backend.engine.models.base import DecoderStackLM, ModelArgs
from dlm_backend.engine.models.config_reader import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, ConfigReader
from dlm_backend.errors import CheckpointError

MASK_ID = 156895        # the reference generate()'s mask_id (and llama.cpp's); config.json has none
MAX_EXPERTS = 4096


@dataclass(frozen=True)
class LLaDAMoEArgs:
    """The MoE and attention extras of a LLaDA-MoE config.json."""

    moe_layers: tuple[bool, ...]        # per layer: routed MoE (True) or dense SwiGLU
    dense_intermediate_size: int | None
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int       # the shared expert's width; 0: none
    expert_bias: bool
    qk_norm: bool
    bias: bool                          # attention_bias: q, k, v and o all carry one
    clip_qkv: float | None


class LLaDAMoEAttention(nn.Module):
    def __init__(self, args: ModelArgs, moe: LLaDAMoEArgs, layer: int):
        super().__init__()
        d, heads, kv, hd = args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim
        self.layer, self.hd, self.clip = layer, hd, moe.clip_qkv
        self.q_proj = ColumnLinear(d, d, bias=moe.bias, what="the attention heads' width")
        self.k_proj = kv_linear(d, kv, heads, hd, bias=moe.bias)
        self.v_proj = kv_linear(d, kv, heads, hd, bias=moe.bias)
        self.o_proj = RowLinear(d, d, bias=moe.bias, what="the attention heads' width")
        self.qk_norm = moe.qk_norm
        if self.qk_norm:                    # one [head_dim] weight shared by every head
            self.q_norm = RMSNorm(hd, args.norm_eps)
            self.k_norm = RMSNorm(hd, args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        q = self.q_proj(x).view(T, -1, self.hd)                         # [T, H, hd]
        k = self.k_proj(x).view(T, -1, self.hd)                         # [T, Hkv, hd]
        v = self.v_proj(x).view(T, -1, self.hd)
        if self.qk_norm:                                                # QK-norm comes before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:                                       # after the norm, as the reference
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        # The reference casts cos/sin to the model dtype and rotates in it (as HF OLMoE).
        q, k = rotate_qk(q, k, cos, sin, full_precision=False)
        return self.o_proj(attention(q, k, v, self.layer).reshape(T, -1))


class LLaDAMoEGate(nn.Module):
    """The router: ``forward(x [T, D], expert_bias [E] | None) -> (topk_idx [T, k], topk_weight [T, k],
    logits [T, E])``, the whole decision, so a forward hook on ``mlp.gate`` observes it."""

    def __init__(self, args: ModelArgs, moe: LLaDAMoEArgs):
        super().__init__()
        self.top_k = moe.top_k
        self.weight = nn.Parameter(torch.empty(moe.num_experts, args.hidden_size))

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None):
        logits = F.linear(x, self.weight)                               # [T, E], in x's dtype (an nn.Linear)
        if expert_bias is None:
            idx, weight = softmax_topk(logits, self.top_k, renormalize=False)
        else:   # the bias moves the fp32 probabilities, and the moved values are the weights
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32) + expert_bias.float()
            weight, idx = probs.topk(self.top_k, dim=-1)
        return idx, weight, logits


class LLaDAMoESparseMoeBlock(nn.Module):
    def __init__(self, args: ModelArgs, moe: LLaDAMoEArgs):
        super().__init__()
        self.gate = LLaDAMoEGate(args, moe)
        self.experts = StackedExperts(moe.num_experts, args.hidden_size, moe.expert_intermediate_size)
        if moe.expert_bias:                 # checkpoint name: mlp.expert_bias
            self.register_buffer("expert_bias", torch.empty(moe.num_experts))
        else:
            self.expert_bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:                # x: [T, D]
        topk_idx, topk_weight, _ = self.gate(x, self.expert_bias)
        return self.experts(x, topk_idx, topk_weight)                   # this rank's experts under TP


class LLaDAMoEDecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, moe: LLaDAMoEArgs, layer: int):
        super().__init__()
        d = args.hidden_size
        self.input_layernorm = RMSNorm(d, args.norm_eps)
        self.self_attn = LLaDAMoEAttention(args, moe, layer)
        self.post_attention_layernorm = RMSNorm(d, args.norm_eps)
        self.routed = moe.moe_layers[layer]
        self.mlp = LLaDAMoESparseMoeBlock(args, moe) if self.routed else GatedMLP(d, moe.dense_intermediate_size)
        # The reference's shared expert sits beside the MoE block (``shared_expert``, not in ``mlp``),
        # on the same normed input; reduced with the routed experts, once.
        self.shared_expert = (GatedMLP(d, moe.shared_intermediate_size, reduce=False)
                              if self.routed and moe.shared_intermediate_size else None)

    def forward(self, x, residual, cos, sin):
        """(previous layer's output, residual stream or None) -> (this layer's output, stream); the
        residual adds run inside the norms, as in the other families."""
        a, x = self.input_layernorm.add_forward(x, residual)
        f, x = self.post_attention_layernorm.add_forward(self.self_attn(a, cos, sin), x)
        if not self.routed:
            return self.mlp(f), x
        y = self.mlp(f)
        if self.shared_expert is not None:
            y = y + self.shared_expert(f)
        tp = self.mlp.experts.tp
        return (y if tp is None else tp.all_reduce(y)), x


class LLaDAMoEModel(nn.Module):
    """The checkpoint's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs, moe: LLaDAMoEArgs):
        super().__init__()
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(LLaDAMoEDecoderLayer(args, moe, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)


class LLaDAMoEModelLM(DecoderStackLM):
    """LLaDA-MoE-7B-A1B Base and Instruct: 16 layers of 64 experts, top 8, every layer routed."""

    tensor_parallel = True                   # built from layers/parallel.py
    logits_shift = 0

    def __init__(self, args: ModelArgs, moe: LLaDAMoEArgs):
        super().__init__(args)
        self.moe = moe
        self.model = LLaDAMoEModel(args, moe)
        if not args.tie_word_embeddings:
            self.lm_head = VocabLinear(args.hidden_size, args.vocab_size)

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        r = ConfigReader(c)
        r.rope_scaling()
        if c.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"config.json: hidden_act {c['hidden_act']!r:.40} is not supported (the MLPs and "
                                  "experts here are SwiGLU; allowed: silu).")
        vocab = r.int("vocab_size", high=MAX_VOCAB)
        hidden, heads = r.int("hidden_size"), r.int("num_attention_heads", high=MAX_HEADS)
        kv_heads = r.int("num_key_value_heads", default=heads, high=MAX_HEADS)
        r.heads(hidden, heads, kv_heads)
        hd = hidden // heads
        # The attention uses hidden // heads; the reference's RoPE init would read a head_dim field.
        if r.int("head_dim", default=hd) != hd:
            raise CheckpointError(f"config.json: head_dim {c['head_dim']} is not hidden_size // "
                                  f"num_attention_heads ({hd}), which the reference's attention uses. Fix config.json.")
        # The config class's default is -1 (no rotation at all): the field is required here.
        rotary = int(hd * r.float("partial_rotary_factor", high=1.0))
        if rotary < 2 or rotary % 2:
            raise CheckpointError(f"config.json: partial_rotary_factor {c['partial_rotary_factor']} rotates "
                                  f"{rotary} of {hd} dims; it must be an even number of at least 2.")
        return ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_layers=r.int("num_hidden_layers", high=MAX_LAYERS),
            num_heads=heads, num_kv_heads=kv_heads, intermediate_size=0,     # widths: LLaDAMoEArgs
            max_positions=r.int("max_position_embeddings", default=4096, high=MAX_POSITIONS),
            rope_theta=r.float("rope_theta"), norm_eps=r.float("rms_norm_eps", default=1e-5, high=1),
            mask_token_id=r.int("mask_token_id", default=MASK_ID, low=0, high=vocab - 1),
            eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
            bos_token_id=r.token_id("bos_token_id", vocab),
            tie_word_embeddings=r.bool("tie_word_embeddings"), rotary_dim=rotary if rotary < hd else None)

    @classmethod
    def moe_from_config(cls, c: dict, layers: int) -> LLaDAMoEArgs:
        r = ConfigReader(c)
        freq = c.get("moe_layer_freq")
        if (not isinstance(freq, list) or len(freq) < layers
                or not all(isinstance(f, int) and not isinstance(f, bool) for f in freq)):
            raise CheckpointError(f"config.json: moe_layer_freq must be a list of integers, one per layer (0: dense, "
                                  f"else MoE) for all {layers} layers, got {freq!r:.60}. Fix config.json.")
        routed = tuple(f != 0 for f in freq[:layers])
        dense = r.int("dense_intermediate_size") if not all(routed) else None
        experts = top_k = width = shared = 0
        if any(routed):
            experts = r.int("num_experts", high=MAX_EXPERTS)
            top_k = r.int("num_experts_per_tok", high=experts)
            width = r.int("expert_intermediate_size")
            # null: no shared expert (the reference tests ``is not None``); absent is the config class's
            # -1, a layer it cannot build, so the field is required. 0 builds an MLP that adds nothing.
            if "shared_expert_intermediate_size" not in c or c["shared_expert_intermediate_size"] is not None:
                shared = r.int("shared_expert_intermediate_size", low=0)
        clip = c.get("clip_qkv")
        return LLaDAMoEArgs(
            moe_layers=routed, dense_intermediate_size=dense, num_experts=experts, top_k=top_k,
            expert_intermediate_size=width, shared_intermediate_size=shared,
            expert_bias=r.bool("moe_router_enable_expert_bias"), qk_norm=r.bool("qk_layernorm"),
            bias=r.bool("attention_bias"), clip_qkv=None if clip is None else r.float("clip_qkv", high=1e6))

    @classmethod
    def from_config(cls, c: dict) -> LLaDAMoEModelLM:
        args = cls.args_from_config(c)
        return cls(args, cls.moe_from_config(c, args.num_layers))

    def stacked_name(self, name: str) -> tuple[str, int] | None:
        return stacked_expert_name(name)

