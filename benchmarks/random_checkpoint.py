"""Random checkpoints in the block families' official formats, built in memory or written to a folder.

The parity fixtures are tiny (hidden 64); a benchmark needs a model where the forward, not Python,
dominates. ``block_config(family, ...)`` is a config.json in the family's own field names;
``random_model`` builds that model with random weights (std 1/sqrt(fan_in), norms 1, on any device,
materialised once: the meta device first); ``write_checkpoint`` saves it with the checkpoint's
tensor names (per-expert tensors, as the released MoE checkpoints store them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from dlm_backend.engine.models.registry import resolve_model_class

_STACKED = re.compile(r"^(.+\.experts)\.(gate_proj|up_proj|down_proj)$")


def block_config(family: str, hidden: int = 256, layers: int = 4, vocab: int = 4096, heads: int = 4,
                 kv_heads: int = 2, experts: int = 16, block: int = 32, max_len: int = 4096) -> dict:
    """config.json of a random ``family`` model ("llada2", "sdar", "fastdllm2", "nemotron", "wedlm" or
    "diffusiongemma")."""
    head_dim = hidden // heads
    common = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": 4 * hidden,
              "max_position_embeddings": max_len, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "eos_token_id": vocab - 3, "pad_token_id": vocab - 3, "bos_token_id": vocab - 4, "hidden_act": "silu"}
    if family == "llada2":
        return {**common, "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
                "mask_token_id": vocab - 1, "rope_theta": 600000.0, "partial_rotary_factor": 0.5,
                "use_qk_norm": True, "use_qkv_bias": False, "use_bias": False, "num_experts": experts,
                "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
                "moe_intermediate_size": hidden // 2, "num_shared_experts": 1, "first_k_dense_replace": 1,
                "norm_topk_prob": True, "moe_router_enable_expert_bias": True, "score_function": "sigmoid",
                "router_dtype": "fp32"}
    if family == "sdar":
        return {**common, "architectures": ["SDARForCausalLM"], "model_type": "sdar", "block_size": block,
                "mask_token_id": vocab - 1, "rope_theta": 1000000.0, "attention_bias": False}
    if family == "fastdllm2":
        return {**common, "architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen",
                "bd_size": block, "mask_token_id": vocab - 1, "rope_theta": 1000000.0, "head_dim": None}
    if family == "nemotron":        # the released 3B's rope_parameters (YaRN 0.25, Llama 4 query scale)
        return {**common, "architectures": ["NemotronLabsDiffusionModel"], "model_type": "nemotron_labs_diffusion",
                "block_size": block, "mask_token_id": vocab - 1, "dlm_paradigm": "bidirectional",
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 0.25,
                                    "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}}
    if family == "wedlm":           # WeDLM-8B's layers (Qwen3: QK-norm, no q/k/v biases)
        return {**common, "architectures": ["WeDLMForCausalLM"], "model_type": "wedlm", "mask_token_id": vocab - 1,
                "rope_theta": 1000000.0, "attention_bias": False, "qk_norm": True}
    if family == "diffusiongemma":
        return dgemma_config(hidden, layers, vocab, heads, kv_heads, experts, block, max_len)
    raise ValueError(f"unknown family {family!r}")


def dgemma_config(hidden: int = 256, layers: int = 6, vocab: int = 4096, heads: int = 4, kv_heads: int = 2,
                  experts: int = 16, canvas: int = 32, max_len: int = 4096, window: int = 64, top_k: int = 4,
                  intermediate: int | None = None, moe_width: int | None = None, head_dim: int | None = None,
                  global_head_dim: int | None = None, global_kv_heads: int = 1) -> dict:
    """config.json of a random DiffusionGemma in the official nested form: five sliding layers to one
    full (the last), full layers twice as wide with fewer key/value heads and V = K."""
    hd = head_dim or hidden // heads
    text = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": hd, "global_head_dim": global_head_dim or 2 * hd,
            "num_global_key_value_heads": global_kv_heads, "attention_k_eq_v": True,
            "intermediate_size": intermediate or 2 * hidden, "moe_intermediate_size": moe_width or hidden // 2,
            "num_experts": experts, "top_k_experts": top_k, "enable_moe_block": True, "sliding_window": window,
            "max_position_embeddings": max_len, "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "eos_token_id": 1,
            "pad_token_id": 0, "bos_token_id": 2, "use_bidirectional_attention": "vision",
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention"
                            for i in range(layers)],
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1000000.0}}}
    return {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
            "canvas_length": canvas, "tie_word_embeddings": True, "text_config": text, "eos_token_id": 1}


@torch.no_grad()
def random_model(config: dict, device="cpu", dtype=torch.float32, seed: int = 0):
    """The model ``config`` describes, random weights, built on the meta device then filled in place."""
    cls = resolve_model_class(config)
    with torch.device("meta"):
        model = cls.from_config({k: v for k, v in config.items() if v is not None})
    model = model.to(dtype=dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.dim() == 1:
            t.fill_(0.0 if name.endswith(("bias", "expert_bias")) else 1.0)   # norms 1, biases 0
        else:
            t.normal_(0.0, 1.0 if "embed" in name else t.shape[-1] ** -0.5, generator=g)
    model.setup(device)
    return model.eval()


def write_checkpoint(config: dict, folder: Path, seed: int = 0) -> Path:
    """Save a random ``config`` model in its checkpoint format (per-expert tensors, float32)."""
    from safetensors.torch import save_file

    state = {}
    fused = config["architectures"] == ["DiffusionGemmaForBlockDiffusion"]    # its experts are stored stacked
    for name, t in random_model(config, seed=seed).state_dict().items():
        m = None if fused else _STACKED.match(name)
        if m:
            for e in range(t.shape[0]):
                state[f"{m[1]}.{e}.{m[2]}.weight"] = t[e].contiguous()
        else:
            state[name] = t.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    if fused:        # the official generation_config.json's sampler fields
        (folder / "generation_config.json").write_text(json.dumps({
            "eos_token_id": [1, 106], "pad_token_id": 0, "max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8,
            "stability_threshold": 1, "confidence_threshold": 0.005,
            "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1}}))
    save_file(state, str(folder / "model.safetensors"))
    return folder
