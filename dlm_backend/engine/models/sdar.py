"""SDAR (JetAstra; also TraDo and other ``sdar``-tagged checkpoints): Qwen3 continued-pretrained as a
block-diffusion model. ``SDARForCausalLM`` is dense Qwen3, ``SDARMoeForCausalLM`` is Qwen3-MoE.

Qwen3 layers: separate q/k/v/o projections, per-head QK-norm before a full (NeoX) rotary, SwiGLU,
untied head. config.json carries ``block_size`` (4 for the base checkpoints, 8..64 for the "-bN"
ones) and ``mask_token_id``. Module names mirror the checkpoint (``model.layers.{i}.self_attn.q_proj``
...); MoE per-expert tensors load into stacked weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dlm_backend.engine.layers import RMSNorm, attention, rotate_qk
from dlm_backend.engine.layers.mlp import GatedMLP
from dlm_backend.engine.layers.parallel import ColumnLinear, RowLinear, VocabEmbedding, VocabLinear, kv_linear
from dlm_backend.engine.layers.routers import StackedExperts, softmax_topk, stacked_expert_name
from dlm_backend.engine.models.base import DecoderStackLM, ModelArgs
from dlm_backend.engine.models.config_reader import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, ConfigReader
from dlm_backend.errors import CheckpointError

MAX_EXPERTS = 4096


@dataclass(frozen=True)
class SDARMoeArgs:
    """The MoE half of an SDAR-MoE (Qwen3-MoE) config.json."""

    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: frozenset[int]
    shared_expert_intermediate_size: int   # 0: none (Qwen3-MoE); else Qwen2-MoE's gated shared expert

    def sparse(self, layer: int) -> bool:
        """Qwen3-MoE's rule for which layers route (the others keep a dense MLP)."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0


class SDARAttention(nn.Module):
    """Qwen3 attention: q/k/v/o (biased only with attention_bias), q_norm/k_norm, full rotary."""

    def __init__(self, args: ModelArgs, layer: int, bias: bool):
        super().__init__()
        d, hd, heads, kv = args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads
        self.layer, self.hd = layer, hd
        self.q_proj = ColumnLinear(d, heads * hd, bias=bias, what="the attention heads' width")
        self.k_proj = kv_linear(d, kv, heads, hd, bias=bias)
        self.v_proj = kv_linear(d, kv, heads, hd, bias=bias)
        self.o_proj = RowLinear(heads * hd, d, bias=bias, what="the attention heads' width")
        self.q_norm = RMSNorm(hd, args.norm_eps)
        self.k_norm = RMSNorm(hd, args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(T, -1, self.hd))           # [T, H, hd], QK-norm before RoPE
        k = self.k_norm(self.k_proj(x).view(T, -1, self.hd))           # [T, Hkv, hd]
        v = self.v_proj(x).view(T, -1, self.hd)
        q, k = rotate_qk(q, k, cos, sin, full_precision=False)          # Qwen3: cos/sin in the model dtype
        return self.o_proj(attention(q, k, v, self.layer).reshape(T, -1))


class SDARMoeSparseMoeBlock(nn.Module):
    """Qwen3-MoE block: softmax top-k router ``gate``, stacked ``experts``; optionally Qwen2-MoE's
    ``shared_expert`` scaled by ``sigmoid(shared_expert_gate(x))``."""

    def __init__(self, args: ModelArgs, moe: SDARMoeArgs):
        super().__init__()
        self.moe = moe
        self.gate = nn.Linear(args.hidden_size, moe.num_experts, bias=False)
        self.experts = StackedExperts(moe.num_experts, args.hidden_size, moe.moe_intermediate_size)
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:       # reduced with the routed experts, once
            self.shared_expert = GatedMLP(args.hidden_size, moe.shared_expert_intermediate_size, reduce=False)
            self.shared_expert_gate = nn.Linear(args.hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_idx [T, k], topk_weight [T, k] fp32)``: gate logits in the model dtype (as Qwen3-MoE),
        softmax in fp32."""
        return softmax_topk(self.gate(x), self.moe.top_k, self.moe.norm_topk_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:                # x: [T, D]
        topk_idx, topk_weight = self.route(x)
        y = self.experts(x, topk_idx, topk_weight)          # this rank's experts under TP
        if self.shared_expert is not None:
            y = y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return y if self.experts.tp is None else self.experts.tp.all_reduce(y)


class SDARDecoderLayer(nn.Module):
    """Pre-norm attention then a dense MLP or, in an SDAR-MoE sparse layer, the MoE block."""

    def __init__(self, args: ModelArgs, layer: int, bias: bool, moe: SDARMoeArgs | None):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.self_attn = SDARAttention(args, layer, bias)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.mlp = (SDARMoeSparseMoeBlock(args, moe) if moe is not None and moe.sparse(layer)
                    else GatedMLP(args.hidden_size, args.intermediate_size))

    def forward(self, x, residual, cos, sin):
        """(previous layer's output, residual stream or None) -> (this layer's output, stream)."""
        a, x = self.input_layernorm.add_forward(x, residual)
        f, x = self.post_attention_layernorm.add_forward(self.self_attn(a, cos, sin), x)
        return self.mlp(f), x


class SDARModel(nn.Module):
    """The checkpoint's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs, bias: bool, moe: SDARMoeArgs | None):
        super().__init__()
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(SDARDecoderLayer(args, i, bias, moe) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)


class SDARForCausalLM(DecoderStackLM):
    """SDAR / TraDo dense checkpoints (Qwen3 layers), block-causal with config.json's block_size."""

    tensor_parallel = True                   # built from layers/parallel.py
    logits_shift = 0
    # SDAR's dynamic low-confidence rule at 0.9 (its README, JetEngine and LMDeploy examples).
    sampling_defaults = {"sampler": "sdar", "remasking": "low_confidence_dynamic", "threshold": 0.9,
                         "cache": "prefix"}
    #: head size when config.json has none: the reference SDARConfig's default (configuration_sdar.py,
    #: ``head_dim=128``), which HF applies before modeling_sdar.py reads it; hidden / heads is another
    #: size for SDAR-4B (2560 / 32 = 80). None: hidden / heads.
    default_head_dim: int | None = 128

    def __init__(self, args: ModelArgs, attention_bias: bool = False, moe: SDARMoeArgs | None = None):
        super().__init__(args)
        self.model = SDARModel(args, attention_bias, moe)
        if not args.tie_word_embeddings:
            self.lm_head = VocabLinear(args.hidden_size, args.vocab_size)

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        r = ConfigReader(c)
        r.rope_scaling()
        if r.bool("use_sliding_window"):
            raise CheckpointError("config.json: use_sliding_window: true asks for sliding-window attention, which "
                                  "is not implemented for SDAR (no released SDAR checkpoint uses it).")
        if c.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"config.json: hidden_act {c.get('hidden_act')!r:.40} is not supported (the "
                                  "MLPs here are SwiGLU: silu).")
        vocab = r.int("vocab_size", high=MAX_VOCAB)
        hidden, heads = r.int("hidden_size"), r.int("num_attention_heads", high=MAX_HEADS)
        kv_heads = r.int("num_key_value_heads", default=heads, high=MAX_HEADS)
        head_dim = r.int("head_dim", default=cls.default_head_dim)
        r.heads(heads * head_dim if head_dim else hidden, heads, kv_heads)   # Qwen3's head_dim need not be D/H
        return ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_layers=r.int("num_hidden_layers", high=MAX_LAYERS),
            num_heads=heads, num_kv_heads=kv_heads, intermediate_size=r.int("intermediate_size"),
            max_positions=r.int("max_position_embeddings", default=32768, high=MAX_POSITIONS),
            rope_theta=r.float("rope_theta", default=10000.0), norm_eps=r.float("rms_norm_eps", default=1e-6, high=1),
            mask_token_id=r.int("mask_token_id", default=None, low=0, high=vocab - 1),
            eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
            bos_token_id=r.token_id("bos_token_id", vocab),
            tie_word_embeddings=r.bool("tie_word_embeddings"), explicit_head_dim=head_dim,
            # Required: a wrong block silently changes the attention mask and every output.
            block_size=r.int("block_size", high=MAX_POSITIONS))

    @classmethod
    def from_config(cls, c: dict) -> "SDARForCausalLM":
        return cls(cls.args_from_config(c), ConfigReader(c).bool("attention_bias"))



class SDARMoeForCausalLM(SDARForCausalLM):
    """SDAR-30B-A3B (Chat, Sci): Qwen3-MoE layers; ``decoder_sparse_step`` / ``mlp_only_layers`` keep
    some layers dense as in Qwen3-MoE."""

    default_head_dim = None         # its config class is not among the references read here: hidden / heads

    @classmethod
    def moe_from_config(cls, c: dict) -> SDARMoeArgs:
        r = ConfigReader(c)
        experts = r.int("num_experts", high=MAX_EXPERTS)
        layers = r.int("num_hidden_layers", high=MAX_LAYERS)
        only = c.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers
                                                 for i in only):
            raise CheckpointError(f"config.json: mlp_only_layers must be a list of layer indices in [0, {layers}), "
                                  f"got {only!r:.60}. Fix config.json.")
        return SDARMoeArgs(
            num_experts=experts, top_k=r.int("num_experts_per_tok", high=experts),
            moe_intermediate_size=r.int("moe_intermediate_size"),
            norm_topk_prob=r.bool("norm_topk_prob", default=False),         # Qwen3MoeConfig's default
            decoder_sparse_step=r.int("decoder_sparse_step", default=1, high=MAX_LAYERS),
            mlp_only_layers=frozenset(only),
            shared_expert_intermediate_size=r.int("shared_expert_intermediate_size", default=0, low=0))

    @classmethod
    def from_config(cls, c: dict) -> "SDARMoeForCausalLM":
        return cls(cls.args_from_config(c), ConfigReader(c).bool("attention_bias"), cls.moe_from_config(c))

    def stacked_name(self, name: str) -> tuple[str, int] | None:
        return stacked_expert_name(name)
