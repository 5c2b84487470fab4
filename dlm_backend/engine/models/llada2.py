"""LLaDA2.0 / LLaDA2.1 (``LLaDA2MoeModelLM``, model_type ``llada2_moe``): Ling-2.0 (BailingMoeV2) MoE
layers, decoded block by block with block-causal attention.

Pre-norm layers with a fused ``query_key_value``, per-head QK-norm before a partial (NeoX) rotary,
a dense SwiGLU in the first ``first_k_dense_replace`` layers and a routed MoE with a shared expert
after them. The router is fp32 sigmoid with an expert bias and group-limited top-k
(:func:`~dlm_backend.engine.layers.routers.grouped_sigmoid_topk`). Module names mirror the checkpoint
(``model.layers.{i}.attention.query_key_value`` ...); per-expert tensors load into stacked weights.

The mask id is not in config.json (the tokenizer's ``<|mask|>``), and config.json has no block
size: the reference ``generate()`` defaults to ``block_length=32``, used here.
LLaDA2.2 (block-level expert admission, DELETE/SPLIT editing tokens) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlm_backend.engine.layers import RMSNorm, attention, rotate_qk
from dlm_backend.engine.layers.mlp import GatedMLP
from dlm_backend.engine.layers.parallel import RowLinear, VocabEmbedding, VocabLinear, local_heads, qkv_linear
from dlm_backend.engine.layers.routers import StackedExperts, grouped_sigmoid_topk, stacked_expert_name
from dlm_backend.engine.models.base import DiffusionLM, ModelArgs
from dlm_backend.engine.models.config_reader import (MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, MAX_WIDTH,
                                                   ConfigReader)
from dlm_backend.errors import CheckpointError

BLOCK_LENGTH = 32       # the reference generate()'s block_length default; config.json has none
MAX_EXPERTS = 4096
# Fields only a LLaDA2.2 config can carry: its editing tokens and its block-level expert admission.
LLADA22_MARKERS = ("delete_token", "split_token", "insert_token", "block_rout", "admission", "admit")


@dataclass(frozen=True)
class LLaDA2MoeArgs:
    """The MoE half of a LLaDA2 config.json."""

    num_experts: int
    top_k: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    moe_intermediate_size: int
    shared_intermediate_size: int       # moe_intermediate_size * num_shared_experts, one fused MLP; 0: none
    first_k_dense_replace: int
    use_qk_norm: bool
    qkv_bias: bool
    dense_bias: bool


class LLaDA2MoeAttention(nn.Module):
    """Fused QKV, per-head QK-norm, partial rotary, ``dense`` output; scale head_dim^-0.5 (the default)."""

    def __init__(self, args: ModelArgs, moe: LLaDA2MoeArgs, layer: int):
        super().__init__()
        self.layer, self.hd = layer, args.head_dim
        heads, kv = local_heads(args.num_heads, args.num_kv_heads)         # this rank's, under TP
        self.heads = (heads, kv, kv)
        self.query_key_value = qkv_linear(args.hidden_size, args.num_heads, args.num_kv_heads, self.hd,
                                          bias=moe.qkv_bias)
        self.qk_norm = moe.use_qk_norm
        if self.qk_norm:
            self.query_layernorm = RMSNorm(self.hd, args.norm_eps)
            self.key_layernorm = RMSNorm(self.hd, args.norm_eps)
        self.dense = RowLinear(args.num_heads * self.hd, args.hidden_size, bias=moe.dense_bias,
                               what="the attention heads' width")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.query_key_value(x).view(T, -1, self.hd)              # [T, H + 2Hkv, hd]
        q, k, v = qkv.split(self.heads, dim=1)                          # [T, H, hd], [T, Hkv, hd] x2
        if self.qk_norm:                                                # QK-norm comes before RoPE
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        # The reference casts cos/sin to the model dtype and rotates in it (as HF Llama).
        q, k = rotate_qk(q, k, cos, sin, full_precision=False)
        return self.dense(attention(q, k, v, self.layer).reshape(T, -1))


class LLaDA2MoeGate(nn.Module):
    """The fp32 router: ``forward(x [T, D]) -> (topk_idx [T, k], topk_weight [T, k], logits [T, E])``.

    Its return value is the router's whole decision, so a forward hook on ``mlp.gate`` observes it
    (the parity tests compare it with the reference's) at no cost to a normal forward.
    """

    def __init__(self, args: ModelArgs, moe: LLaDA2MoeArgs):
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, args.hidden_size))
        self.register_buffer("expert_bias", torch.empty(moe.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.moe
        logits = F.linear(x.float(), self.weight.float())               # [T, E], fp32 as the reference
        idx, weight = grouped_sigmoid_topk(logits, self.expert_bias, m.top_k, m.n_group, m.topk_group,
                                           m.routed_scaling_factor)
        return idx, weight, logits


class LLaDA2MoeSparseMoeBlock(nn.Module):
    """Routed experts (weighted, combined in fp32) plus the unweighted shared expert."""

    def __init__(self, args: ModelArgs, moe: LLaDA2MoeArgs):
        super().__init__()
        self.gate = LLaDA2MoeGate(args, moe)
        self.experts = StackedExperts(moe.num_experts, args.hidden_size, moe.moe_intermediate_size)
        # reduced with the routed experts, once
        self.shared_experts = (GatedMLP(args.hidden_size, moe.shared_intermediate_size, reduce=False)
                               if moe.shared_intermediate_size else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:               # x: [T, D]
        topk_idx, topk_weight, _ = self.gate(x)
        y = self.experts(x, topk_idx, topk_weight)          # this rank's experts under TP
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y if self.experts.tp is None else self.experts.tp.all_reduce(y)


class LLaDA2MoeDecoderLayer(nn.Module):
    """Pre-norm attention then a dense MLP (layers < first_k_dense_replace) or the MoE block."""

    def __init__(self, args: ModelArgs, moe: LLaDA2MoeArgs, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.attention = LLaDA2MoeAttention(args, moe, layer)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.mlp = (GatedMLP(args.hidden_size, args.intermediate_size) if layer < moe.first_k_dense_replace
                    else LLaDA2MoeSparseMoeBlock(args, moe))

    def forward(self, x, residual, cos, sin):
        """(previous layer's output, residual stream or None) -> (this layer's output, stream); the
        residual adds run inside the norms, as in the other families."""
        a, x = self.input_layernorm.add_forward(x, residual)
        f, x = self.post_attention_layernorm.add_forward(self.attention(a, cos, sin), x)
        return self.mlp(f), x


class LLaDA2MoeModel(nn.Module):
    """The checkpoint's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs, moe: LLaDA2MoeArgs):
        super().__init__()
        self.word_embeddings = VocabEmbedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(LLaDA2MoeDecoderLayer(args, moe, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)


class LLaDA2MoeModelLM(DiffusionLM):
    """LLaDA2.0 / 2.1 mini and flash (and -CAP): block-diffusion MoE, untied fp32-logit head."""

    tensor_parallel = True                   # built from layers/parallel.py
    logits_shift = 0
    # The LLaDA2.0 report's evaluation set-up (§6.1): greedy, blocks of 32, threshold 0.95.
    sampling_defaults = {"sampler": "llada2", "threshold": 0.95, "cache": "prefix"}

    def __init__(self, args: ModelArgs, moe: LLaDA2MoeArgs):
        super().__init__(args)
        self.moe = moe
        self.model = LLaDA2MoeModel(args, moe)
        if not args.tie_word_embeddings:
            self.lm_head = VocabLinear(args.hidden_size, args.vocab_size)

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        _refuse_unsupported(c)
        r = ConfigReader(c)
        r.rope_scaling()
        vocab = r.int("vocab_size", high=MAX_VOCAB)
        hidden, heads = r.int("hidden_size"), r.int("num_attention_heads", high=MAX_HEADS)
        kv_heads = r.int("num_key_value_heads", default=heads, high=MAX_HEADS)
        head_dim = r.int("head_dim", default=None)
        r.heads(heads * head_dim if head_dim else hidden, heads, kv_heads)   # head_dim may not be hidden/heads
        hd = head_dim or hidden // heads
        factor = r.float("partial_rotary_factor", default=0.5, high=1.0)     # the reference config's default
        rotary = int(hd * factor)   # the reference's RoPE init: int(head_dim * partial_rotary_factor)
        if rotary < 2 or rotary % 2 or r.int("rotary_dim", default=rotary, high=hd) != rotary:
            raise CheckpointError(f"config.json: rotary_dim {c.get('rotary_dim')} and partial_rotary_factor "
                                  f"{factor} (head_dim {hd}) must agree on an even rotary width; the reference "
                                  "rotates int(head_dim * partial_rotary_factor) dims. Fix config.json.")
        layers = r.int("num_hidden_layers", high=MAX_LAYERS)
        dense_layers = r.int("first_k_dense_replace", default=0, low=0, high=layers)
        # Only the dense layers use intermediate_size; an all-MoE config may leave it out.
        width = r.int("intermediate_size") if dense_layers else r.int(
            "intermediate_size", default=r.int("moe_intermediate_size"))
        return ModelArgs(
            vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
            intermediate_size=width,
            max_positions=r.int("max_position_embeddings", default=16384, high=MAX_POSITIONS),
            rope_theta=r.float("rope_theta", default=10000.0), norm_eps=r.float("rms_norm_eps", default=1e-5, high=1),
            mask_token_id=r.int("mask_token_id", default=None, low=0, high=vocab - 1),
            eos_token_ids=r.token_ids("eos_token_id", vocab), pad_token_id=r.token_id("pad_token_id", vocab),
            bos_token_id=r.token_id("bos_token_id", vocab),
            tie_word_embeddings=r.bool("tie_word_embeddings"), explicit_head_dim=head_dim,
            rotary_dim=rotary if rotary < hd else None, block_size=BLOCK_LENGTH)

    @classmethod
    def moe_from_config(cls, c: dict) -> LLaDA2MoeArgs:
        r = ConfigReader(c)
        experts = r.int("num_experts", high=MAX_EXPERTS)
        n_group = r.int("n_group", default=8, high=experts)
        if experts % n_group or experts // n_group < 2:
            # The group score sums each group's two best experts.
            raise CheckpointError(f"config.json: num_experts ({experts}) must split into n_group ({n_group}) "
                                  "equal groups of at least 2 experts. Fix config.json.")
        topk_group = r.int("topk_group", default=4, high=n_group)
        width = r.int("moe_intermediate_size")
        # The HF reference (LLaDA2.0 and 2.1 modeling_llada2_moe.py) builds the shared experts as one
        # fused SwiGLU MLP, ``shared_experts``, of width moe_intermediate_size * num_shared_experts,
        # and never reads moe_shared_expert_intermediate_size (its config class has no such field).
        # SGLang multiplies that field instead: the same width only while it equals
        # moe_intermediate_size, so a reference checkpoint with 2 shared experts and that field at
        # any other value was refused with the config and weights said to disagree.
        # num_shared_experts absent is the config class's default 0, which the reference builds as a
        # width-0 MLP that adds nothing; null builds none. Both are no shared expert here.
        shared = r.int("num_shared_experts", default=0, low=0, high=MAX_EXPERTS)
        shared_width = width * shared
        if shared_width > MAX_WIDTH:
            raise CheckpointError(f"config.json: num_shared_experts ({shared}) * moe_intermediate_size ({width}) "
                                  f"= {shared_width}, the width the reference gives the fused shared expert, "
                                  f"is over {MAX_WIDTH}. Fix config.json.")
        return LLaDA2MoeArgs(
            num_experts=experts, top_k=r.int("num_experts_per_tok", default=2, high=topk_group * (experts // n_group)),
            n_group=n_group, topk_group=topk_group,
            routed_scaling_factor=r.float("routed_scaling_factor", default=2.5, high=1e4),
            moe_intermediate_size=width, shared_intermediate_size=shared_width,
            first_k_dense_replace=r.int("first_k_dense_replace", default=0, low=0, high=MAX_LAYERS),
            use_qk_norm=r.bool("use_qk_norm", default=True), qkv_bias=r.bool("use_qkv_bias", default=False),
            dense_bias=r.bool("use_bias", default=True))     # the reference config's default; released: false

    @classmethod
    def from_config(cls, c: dict) -> "LLaDA2MoeModelLM":
        return cls(cls.args_from_config(c), cls.moe_from_config(c))

    def stacked_name(self, name: str) -> tuple[str, int] | None:
        return stacked_expert_name(name)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary.lookup(positions)                        # [T, 1, rotary_dim]
        x, residual = self.model.word_embeddings(input_ids), None       # [T, D]
        for layer in self.model.layers:
            x, residual = layer(x, residual, cos, sin)
        return residual + x

    def head(self) -> tuple[RMSNorm, torch.Tensor]:
        w = self.model.word_embeddings.weight if self.args.tie_word_embeddings else self.lm_head.weight
        return self.model.norm, w

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden).float()                   # the reference casts logits to fp32


def _refuse_unsupported(c: dict) -> None:
    """Variants the references build differently from what is implemented here, each a CheckpointError."""
    llada22 = sorted(k for k in c if any(m in k.lower() for m in LLADA22_MARKERS))
    if llada22:
        raise CheckpointError(
            f"config.json has {', '.join(llada22)}: this is an LLaDA2.2 checkpoint (Levenshtein editing with "
            "DELETE/SPLIT tokens, block-level expert admission in the router), which is not supported: its "
            "reference decoder and router are not published (SGLang's JointThresholdInDel sampler is an open pull "
            "request, not a release), so there is nothing to check an implementation against. LLaDA2.0 and "
            "LLaDA2.1 checkpoints are supported.")
    r = ConfigReader(c)
    rules = [
        ("hidden_act", c.get("hidden_act", "silu"), ("silu",), "the experts and MLPs here are SwiGLU"),
        ("score_function", c.get("score_function", "sigmoid"), ("sigmoid",), "the router here is sigmoid"),
        ("router_dtype", c.get("router_dtype", "fp32"), ("fp32", "float32"), "the router here runs in fp32"),
    ]
    for name, value, allowed, why in rules:
        if value not in allowed:
            raise CheckpointError(f"config.json: {name} {value!r:.40} is not supported ({why}; allowed: "
                                  f"{', '.join(allowed)}).")
    flags = [
        ("norm_head", True, "an L2-normalised lm_head (SGLang's reading; the HF code ignores the flag)"),
        ("use_sliding_window", True, "sliding-window attention"),
        ("norm_topk_prob", False, "unnormalised routing weights (the HF reference normalises regardless; SGLang "
                                  "does not)"),
        ("moe_router_enable_expert_bias", False, "a router without gate.expert_bias (the HF reference always "
                                                 "applies the loaded bias; SGLang drops it)"),
    ]
    for name, refused, what in flags:
        if r.bool(name, default=not refused) == refused:
            raise CheckpointError(f"config.json: {name}: {str(refused).lower()} asks for {what}, which is not "
                                  "implemented.")
