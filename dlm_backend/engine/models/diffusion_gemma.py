"""DiffusionGemma (``DiffusionGemmaForBlockDiffusion``, Google DeepMind; transformers >= 5.8): one Gemma 4
MoE run two ways with the same weights. Text only: the vision tower's tensors are not loaded.

* **Encoder rows** attend causally and write the KV cache: the prompt's prefill, then each finished
  canvas again, to commit it (engine/requests/uniform_sequence.py plans these as *cache* passes).
* **Decoder rows** denoise a canvas: bidirectional over [cached prefix ; canvas], reading the
  cache without writing it (their keys go to the canvas's own pages, which the commit overwrites),
  and their embeddings take the previous step's logits as self-conditioning
  (:meth:`conditioning_input`). The forward context's ``decoder`` names these rows.

A layer (module names mirror the checkpoint's ``model.decoder.*``)::

    h   = x + post_attention_layernorm(attn(input_layernorm(x)))
    out = h + post_feedforward_layernorm(post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(h)))
                                         + post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(h),
                                                                                router(h))))
    out = out * layer_scalar          (the encoder keeps its own scalars: model.encoder.language_model.*)

Attention: q_norm/k_norm (with weight) replace 1/sqrt(D), so the scale is 1.0; values take v_norm
(no weight); full layers have no v_proj, V is the raw k_proj output. Sliding layers (window W) rotate
every dim (theta 1e4); full layers use "proportional" RoPE (theta 1e6): the first
``int(factor * D / 2)`` frequencies turn, the rest are 0, so dims ``[0, r) and [D/2, D/2 + r)``
rotate. The router (softmax over all experts, top-k, renormalised, times ``per_expert_scale``) reads
the un-normed residual. Embeddings are scaled by sqrt(hidden) in the weight dtype; logits are the
tied embedding, in fp32, soft-capped ``30 * tanh(logits / 30)``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from dlm_backend.engine.layers import attention
from dlm_backend.engine.layers.attention import current_context
from dlm_backend.engine.layers.mlp import GatedMLP
from dlm_backend.engine.layers.moe import experts as run_experts
from dlm_backend.engine.layers.parallel import ColumnLinear, RowLinear, Sharded, kv_linear
from dlm_backend.engine.layers.rotary import apply_rotary
from dlm_backend.engine.layers.routers import softmax_topk
from dlm_backend.engine.models.base import DiffusionLM, ModelArgs
from dlm_backend.engine.models.diffusion_gemma_config import GemmaArgs, read_config
from dlm_backend.engine.parallel.group import build_group
from dlm_backend.engine.sampling_defaults import checkpoint_values


class GemmaRMSNorm(nn.Module):
    """Gemma 4's RMSNorm: ``x * (mean(x^2) + eps)^-0.5`` and the weight (if any) both in fp32, then
    back to x's dtype (no ``1 + w``, unlike Gemma 2/3)."""

    def __init__(self, dim: int, eps: float, scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        return (h if self.weight is None else h * self.weight.float()).to(x.dtype)


def inverse_frequencies(head_dim: int, theta: float, factor: float = 1.0) -> torch.Tensor:
    """``[head_dim / 2]`` RoPE frequencies; ``factor < 1`` is proportional RoPE: the first
    ``int(factor * head_dim // 2)`` are ``theta^(-2i / head_dim)`` (over the whole head, not the
    rotated part) and the rest 0 (those dims pass through)."""
    turning = int(factor * head_dim // 2)
    freq = 1.0 / (theta ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / head_dim))
    return torch.cat([freq, torch.zeros(head_dim // 2 - turning)])


class GemmaAttention(nn.Module):
    def __init__(self, args: ModelArgs, g: GemmaArgs, layer: int):
        super().__init__()
        kv_heads, self.hd = args.kv_shapes[layer]
        self.layer, self.window = layer, g.sliding_window if g.sliding[layer] else None
        d, heads, bias = args.hidden_size, args.num_heads, g.attention_bias
        # Under tensor parallelism: this rank's query heads and key/value heads (the full layers' few
        # are replicated when the ranks outnumber them), o_proj's all-reduce.
        what = "the attention heads' width"
        self.q_proj = ColumnLinear(d, heads * self.hd, bias=bias, what=what)
        self.k_proj = kv_linear(d, kv_heads, heads, self.hd, bias=bias)
        self.v_proj = kv_linear(d, kv_heads, heads, self.hd, bias=bias) if g.sliding[layer] else None
        self.o_proj = RowLinear(heads * self.hd, d, bias=bias, what=what)
        self.q_norm = GemmaRMSNorm(self.hd, args.norm_eps)
        self.k_norm = GemmaRMSNorm(self.hd, args.norm_eps)
        self.v_norm = GemmaRMSNorm(self.hd, args.norm_eps, scale=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        q = apply_rotary(self.q_norm(self.q_proj(x).view(T, -1, self.hd)), cos, sin, False)   # [T, H, hd]
        k = self.k_proj(x).view(T, -1, self.hd)                                                # [T, Hkv, hd]
        v = self.v_proj(x).view(T, -1, self.hd) if self.v_proj is not None else k             # full: V = raw K
        k, v = apply_rotary(self.k_norm(k), cos, sin, False), self.v_norm(v)
        return self.o_proj(attention(q, k, v, self.layer, window=self.window, scale=1.0).reshape(T, -1))


class GemmaRouter(nn.Module):
    """``forward(h [T, D]) -> (topk_idx [T, k], topk_weight [T, k] fp32, logits [T, E])``: the whole
    decision, so a forward hook sees it (the parity checks compare it with the reference's)."""

    def __init__(self, args: ModelArgs, g: GemmaArgs):
        super().__init__()
        self.top_k, self.root = g.top_k, args.hidden_size ** -0.5
        self.norm = GemmaRMSNorm(args.hidden_size, args.norm_eps, scale=False)
        self.proj = nn.Linear(args.hidden_size, g.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(args.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(g.num_experts))

    def forward(self, h: torch.Tensor):
        logits = self.proj(self.norm(h) * self.scale * self.root)                   # [T, E]
        idx, weight = softmax_topk(logits, self.top_k, renormalize=True)
        return idx, weight * self.per_expert_scale[idx], logits


class GemmaExperts(nn.Module, Sharded):
    """E tanh-GELU experts: ``gate_up_proj [E, 2I, D]`` (gate rows first), ``down_proj [E, D, I]``.

    Under tensor parallelism the experts are partitioned (EP = TP): a rank holds experts
    ``[r E / world, (r + 1) E / world)`` whole, reads only their rows of both tensors, and returns
    its partial sum, all-reduced before the block's post-norm. Quantized, the fused gate/up stack is
    split into its halves once at load (``on_quantized``)."""

    quantized_params = ("gate_up_proj", "down_proj")

    def __init__(self, args: ModelArgs, g: GemmaArgs):
        super().__init__()
        self.tp = build_group()
        self.width, self.full = g.moe_intermediate_size, g.num_experts
        self.mine = self.tp.split(g.num_experts, "the experts") if self.tp else slice(0, g.num_experts)
        n = self.mine.stop - self.mine.start
        self.gate_up_proj = nn.Parameter(torch.empty(n, 2 * self.width, args.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(n, args.hidden_size, self.width))

    def full_shape(self, param: str) -> tuple[int, ...]:
        return (self.full, *getattr(self, param).shape[1:])

    def load_shard(self, param: str, part) -> torch.Tensor:
        return part[self.mine]

    def on_quantized(self, param: str) -> None:
        if param == "gate_up_proj":             # two stacks, so each half is packed for its kernel alone
            self.gate_up = nn.ModuleList(self._modules.pop("gate_up_proj").split_rows(self.width))
            self.gate_up_proj = None

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj[:, :self.width], self.gate_up_proj[:, self.width:]  # views, no copy
        else:
            gate, up = self.gate_up
        if self.tp is None:
            return run_experts(x, idx, weight, gate, up, self.down_proj, "gelu_tanh")
        n = self.mine.stop - self.mine.start
        local = idx - self.mine.start
        local = local.masked_fill((local < 0) | (local >= n), n)          # n: another rank's expert
        y = run_experts(x, local, weight, gate, up, self.down_proj, "gelu_tanh", foreign=True)
        return self.tp.all_reduce(y)


class GemmaLayer(nn.Module):
    def __init__(self, args: ModelArgs, g: GemmaArgs, layer: int):
        super().__init__()
        d, eps = args.hidden_size, args.norm_eps
        self.self_attn = GemmaAttention(args, g, layer)
        self.mlp = GatedMLP(d, args.intermediate_size, "gelu_tanh")
        self.router, self.experts = GemmaRouter(args, g), GemmaExperts(args, g)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                     "pre_feedforward_layernorm_2"):
            setattr(self, name, GemmaRMSNorm(d, eps))
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x, cos, sin, scalar: torch.Tensor) -> torch.Tensor:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(h)))
        idx, weight, _ = self.router(h)                                  # the un-normed residual
        routed = self.post_feedforward_layernorm_2(self.experts(self.pre_feedforward_layernorm_2(h), idx, weight))
        return (h + self.post_feedforward_layernorm(dense + routed)) * scalar


class SelfConditioning(GatedMLP):
    """``post_norm(embeddings + down(gelu(gate(pre_norm(soft))) * up(pre_norm(soft))))``: the decoder's
    input, ``soft`` being the previous step's soft embedding (zeros first: the MLP then adds exactly 0)."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.hidden_size, args.intermediate_size, "gelu_tanh")
        self.pre_norm = GemmaRMSNorm(args.hidden_size, args.norm_eps)
        self.post_norm = GemmaRMSNorm(args.hidden_size, args.norm_eps, scale=False)

    def forward(self, embeddings: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        return self.post_norm(embeddings + super().forward(self.pre_norm(soft)))


class Decoder(nn.Module):
    """``model.decoder``: embeddings, layers, final norm and self-conditioning (every weight the
    encoder uses too)."""

    def __init__(self, args: ModelArgs, g: GemmaArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(GemmaLayer(args, g, i) for i in range(args.num_layers))
        self.norm = GemmaRMSNorm(args.hidden_size, args.norm_eps)
        self.self_conditioning = SelfConditioning(args)


class EncoderScalars(nn.Module):
    """``model.encoder.language_model.layers.{i}.layer_scalar``: the one tensor the encoder does not
    share with the decoder (untied buffers, equal in released checkpoints but kept apart)."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Module() for _ in range(num_layers))
        for layer in self.layers:
            layer.register_buffer("layer_scalar", torch.ones(1))


class DiffusionGemmaForBlockDiffusion(DiffusionLM):
    """DiffusionGemma 26B-A4B (and checkpoints of its shape): canvases of uniform noise, denoised by
    the decoder over the encoder's cache (engine/requests/uniform_sequence.py, samplers/diffusiongemma.py)."""

    tensor_parallel = True                   # built from layers/parallel.py
    noise = "uniform"
    # The reference generate()'s defaults (transformers DiffusionGemmaGenerationConfig), under the
    # checkpoint's generation_config.json (family_defaults).
    sampling_defaults = {"sampler": "diffusiongemma", "t_min": 0.4, "t_max": 0.8, "gamma": 0.1,
                         "stability_threshold": 1, "confidence_threshold": 0.005, "max_denoising_steps": 48}
    #: generation_config.json fields that are knobs of the same name (sampler_config.entropy_bound is gamma)
    GENERATION_FIELDS: ClassVar[tuple[str, ...]] = ("t_min", "t_max", "stability_threshold", "confidence_threshold",
                                                    "max_denoising_steps")
    ignored_prefixes = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")

    def __init__(self, args: ModelArgs, g: GemmaArgs):
        super().__init__(args)
        self.gemma = g
        self.model = nn.Module()
        self.model.decoder = Decoder(args, g)
        self.model.encoder = nn.Module()
        self.model.encoder.language_model = EncoderScalars(args.num_layers)
        self.frequencies: dict[bool, torch.Tensor] = {}
        self.scale = torch.tensor(args.hidden_size ** 0.5)      # float32, as the reference's buffer

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        return read_config(c)[0]

    @classmethod
    def from_config(cls, c: dict) -> "DiffusionGemmaForBlockDiffusion":
        return cls(*read_config(c))

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Unchanged: the tied embedding (the head) stays whole on every rank, because the decoder's
        self-conditioning input (softmax over the vocabulary times the embedding) is made on rank 0
        from the sampler's logits, between forwards."""
        return logits

    @classmethod
    def family_defaults(cls, generation_config: dict) -> dict:
        given = {f: generation_config[f] for f in cls.GENERATION_FIELDS if generation_config.get(f) is not None}
        bound = (generation_config.get("sampler_config") or {}).get("entropy_bound")
        if bound is not None:
            given["gamma"] = bound
        return {**cls.sampling_defaults, **checkpoint_values(given, "generation_config.json")}

    def setup(self, device) -> None:
        a, g = self.args, self.gemma
        sliding_dim = a.head_dim
        full_dim = next((d for (_, d), s in zip(a.kv_shapes, g.sliding) if not s), sliding_dim)
        # Computed per forward from positions, as the reference does: a full table would hold 1 GB at
        # 262,144 positions of the 512-wide full heads.
        self.frequencies = {True: inverse_frequencies(sliding_dim, a.rope_theta).to(device),
                            False: inverse_frequencies(full_dim, g.full_theta, g.full_rotary_factor).to(device)}
        # sqrt(hidden) rounded to float32, then to the weights' dtype (bf16 makes sqrt(3072) 55.5)
        weight = self.model.decoder.embed_tokens.weight
        self.scale = torch.tensor(a.hidden_size ** 0.5).to(device=device, dtype=weight.dtype)

    def _rotary(self, positions: torch.Tensor, sliding: bool) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[:, None].float() * self.frequencies[sliding][None, :]      # [T, D/2]
        emb = torch.cat((angles, angles), dim=-1)[:, None, :]                          # [T, 1, D]
        return emb.cos(), emb.sin()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        dec = self.model.decoder
        x = dec.embed_tokens(input_ids) * self.scale                                 # [T, D]
        ctx = current_context()
        rows = ctx.decoder if ctx is not None else None
        is_dec = torch.zeros(x.shape[0], 1, dtype=torch.bool, device=x.device)
        if rows is not None and rows.rows.numel():
            x = x.index_copy(0, rows.rows, dec.self_conditioning(x[rows.rows], rows.conditioning))
            is_dec[rows.rows] = True
        tables = {s: self._rotary(positions, s) for s in (True, False)}
        encoder = self.model.encoder.language_model.layers
        for i, layer in enumerate(dec.layers):
            scalar = torch.where(is_dec, layer.layer_scalar, encoder[i].layer_scalar).to(x.dtype)   # [T, 1]
            x = layer(x, *tables[self.gemma.sliding[i]], scalar)
        return x

    def head(self):
        return self.model.decoder.norm, self.model.decoder.embed_tokens.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        cap = self.gemma.softcap
        return torch.tanh(super().compute_logits(hidden).float() / cap) * cap         # [N, V] fp32

    def conditioning_input(self, logits: torch.Tensor) -> torch.Tensor:
        """The decoder's self-conditioning input ``[n, D]`` from a step's processed logits ``[n, V]``:
        their softmax (fp32, then the embedding dtype) times the embedding, scaled by sqrt(hidden)."""
        weight = self.model.decoder.embed_tokens.weight
        probs = torch.softmax(logits.to(weight.dtype), dim=-1, dtype=torch.float32).to(weight.dtype)
        return (probs @ weight) * self.scale                                          # [n, D]
