"""Published variants that load through an existing family, each checked against its config.json as
published: the family it resolves to, the shapes and token facts ``args_from_config`` reads, and that
the model builds (at full size and scaled down) on the meta device.

Only configs found verbatim are in the table; each entry names where it was read. The HF hub is not
reachable from here, so the sources are GitHub copies of the HF repos and HF pages held by the
search index. Not found (so not tested): TraDo-4B/8B-Instruct, DiffuCoder-7B-Instruct/-cpGRPO, the
SDAR "-b8".."-b64" block-size checkpoints, LLaDA2.1-flash,
WeDLM-7B/8B (Base and Instruct).
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers import FIXTURES

from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.engine.models.llada import LLaDAModelLM
from dlm_backend.engine.models.llada2 import LLaDA2MoeModelLM
from dlm_backend.engine.models.nemotron_labs import NemotronLabsDiffusionModel
from dlm_backend.engine.models.registry import from_config_json, resolve_model_class
from dlm_backend.engine.models.sdar import SDARForCausalLM
from dlm_backend.errors import CheckpointError

# GSAI-ML/LLaDA-1.5 config.json, from the HF repo copied into GitHub
# QuentinFitteRey/LLada-Reasoning@4bfec79d1d9f06cbb9928479dac293763c4c98d6:llada_local_1.5/config.json
# (the copy's README.md is the LLaDA 1.5 model card; its generation_config.json has bos 126080, eos 126081).
LLADA_1_5 = {
    "activation_type": "silu",
    "alibi": False,
    "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        "AutoModel": "modeling_llada.LLaDAModelLM",
    },
    "bias_for_layer_norm": False,
    "block_group_size": 1,
    "block_type": "llama",
    "d_model": 4096,
    "embedding_dropout": 0.0,
    "embedding_size": 126464,
    "eos_token_id": 126081,
    "flash_attention": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "init_cutoff_factor": None,
    "init_device": "meta",
    "init_fn": "mitchell",
    "init_std": 0.02,
    "input_emb_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "mask_token_id": 126336,
    "max_sequence_length": 4096,
    "mlp_hidden_size": 12288,
    "mlp_ratio": 4,
    "model_type": "llada",
    "multi_query_attention": None,
    "n_heads": 32,
    "n_kv_heads": 32,
    "n_layers": 32,
    "pad_token_id": 126081,
    "precision": "amp_bf16",
    "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05,
    "rope": True,
    "rope_full_precision": True,
    "rope_theta": 500000.0,
    "scale_logits": False,
    "transformers_version": "4.46.3",
    "use_cache": False,
    "vocab_size": 126464,
    "weight_tying": False,
}

# JetLM/SDAR-4B-Chat config.json (block size 4, the base of the "-bN" checkpoints and of TraDo-4B), from
# JetAstra/SDAR@c2041a8333333d685f6e15122c84f60f51f85ebd:training/model/SDAR-4B-Chat/config.json,
# identical to https://huggingface.co/JetLM/SDAR-4B-Chat/blob/main/config.json as the search index holds it.
SDAR_4B_CHAT = {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    },
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_implementation": "flex_attention",
    "bos_token_id": 151643,
    "debug": False,
    "eos_token_id": 151643,
    "block_size": 4,
    "mask_token_id": 151669,
    "ep_size": 1,
    "fuse_cross_entropy": True,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 32768,
    "max_window_layers": 36,
    "micro_forward": False,
    "model_type": "sdar",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "skip_checkpoint": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.52.4",
    "use_cache": False,
    "use_deepep": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# JetLM/SDAR-8B-Chat config.json, from
# JetAstra/SDAR@c2041a8333333d685f6e15122c84f60f51f85ebd:training/model/SDAR-8B-Chat/config.json: the 4B file
# with hidden_size 4096 and intermediate_size 12288 (a diff of the two files shows nothing else).
SDAR_8B_CHAT = {**SDAR_4B_CHAT, "hidden_size": 4096, "intermediate_size": 12288}

# inclusionAI/LLaDA2.1-mini config.json, https://huggingface.co/inclusionAI/LLaDA2.1-mini/blob/main/config.json
# as the search index holds it. That copy stops after "transformers_version": the fields sorted after it
# (use_*, vocab_size) were not seen, so they are left out here; vocab_size alone is supplied by the test,
# 157184, the LLaDA2 tokenizer's size (LLaDA2.0-Uni's published config: "image_token_offset": 157184, and
# https://www.sotaaz.com/post/llada2x-en: LLaDA 2.0-mini/flash vocab 157,184). The S and Q modes of
# LLaDA2.1 are decoding thresholds over this one checkpoint, not separate configs.
LLADA2_1_MINI_SEEN = {
    "architectures": ["LLaDA2MoeModelLM"],
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
    },
    "dtype": "bfloat16",
    "embedding_dropout": 0.0,
    "first_k_dense_replace": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "llada2_moe",
    "moe_intermediate_size": 512,
    "moe_router_enable_expert_bias": True,
    "n_group": 8,
    "norm_head": False,
    "norm_softmax": False,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 20,
    "num_key_value_heads": 4,
    "num_shared_experts": 1,
    "output_dropout": 0.0,
    "output_router_logits": False,
    "pad_token_id": 156892,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 600000,
    "rotary_dim": 64,
    "routed_scaling_factor": 2.5,
    "router_dtype": "fp32",
    "score_function": "sigmoid",
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "transformers_version": "4.57.1",
}
LLADA2_1_MINI = {**LLADA2_1_MINI_SEEN, "vocab_size": 157184}

# name -> (config.json, family, what args_from_config must read from it)
# nvidia/Nemotron-Labs-Diffusion-3B-Base config.json, field by field as a port's notes list them from the
# downloaded file ("Base Config Inventory" of the Deliverance project's Nemotron Labs Diffusion port
# plan, in the search index): not a verbatim copy, the one listing of the released values found.
NEMOTRON_3B = {
    "architectures": ["NemotronLabsDiffusionModel"], "model_type": "nemotron_labs_diffusion",
    "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                 "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
    "torch_dtype": "bfloat16", "vocab_size": 131072, "hidden_size": 3072, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "sliding_window": None, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False, "use_cache": False, "mask_token_id": 100, "block_size": 32,
    "dlm_paradigm": "bidirectional", "ar_loss_weight": 1.0, "dlm_loss_weight": None, "dp_varying_mask_ratio": False,
    "attn_implementation": "sdpa",
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 0.25,
                        "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1},
}

VARIANTS = {
    "GSAI-ML/LLaDA-1.5": (LLADA_1_5, LLaDAModelLM, dict(
        hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128, vocab_size=126464,
        intermediate_size=12288, block_size=None, mask_token_id=126336, eos_token_ids=(126081,),
        pad_token_id=126081, max_positions=4096, rope_theta=500000.0, rotary_dim=None)),
    "JetLM/SDAR-4B-Chat": (SDAR_4B_CHAT, SDARForCausalLM, dict(
        hidden_size=2560, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=151936,
        intermediate_size=9728, block_size=4, mask_token_id=151669, eos_token_ids=(151643,),
        bos_token_id=151643, max_positions=32768, rope_theta=1e6, rotary_dim=None)),
    "JetLM/SDAR-8B-Chat": (SDAR_8B_CHAT, SDARForCausalLM, dict(
        hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=151936,
        intermediate_size=12288, block_size=4, mask_token_id=151669, eos_token_ids=(151643,),
        bos_token_id=151643, max_positions=32768, rope_theta=1e6, rotary_dim=None)),
    "inclusionAI/LLaDA2.1-mini": (LLADA2_1_MINI, LLaDA2MoeModelLM, dict(
        hidden_size=2048, num_layers=20, num_heads=16, num_kv_heads=4, head_dim=128, vocab_size=157184,
        intermediate_size=5120, block_size=32, mask_token_id=None, eos_token_ids=(), pad_token_id=156892,
        max_positions=32768, rope_theta=600000.0, rotary_dim=64)),
    "nvidia/Nemotron-Labs-Diffusion-3B-Base": (NEMOTRON_3B, NemotronLabsDiffusionModel, dict(
        hidden_size=3072, num_layers=26, num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=131072,
        intermediate_size=9216, block_size=32, mask_token_id=100, eos_token_ids=(2,), bos_token_id=1,
        max_positions=4096, rope_theta=1e6, rotary_dim=None)),
}
NAMES = sorted(VARIANTS)


@pytest.mark.parametrize("name", NAMES)
def test_resolves_to_its_family(name):
    config, family, _ = VARIANTS[name]
    assert resolve_model_class(config) is family


@pytest.mark.parametrize("name", NAMES)
def test_reader_reads_the_published_shapes(name):
    config, family, facts = VARIANTS[name]
    args = from_config_json(family.args_from_config, config)
    assert {field: getattr(args, field) for field in facts} == facts


def test_llada2_1_mini_moe_facts():
    moe = LLaDA2MoeModelLM.moe_from_config(LLADA2_1_MINI)
    assert (moe.num_experts, moe.top_k, moe.n_group, moe.topk_group) == (256, 8, 8, 4)
    assert (moe.moe_intermediate_size, moe.shared_intermediate_size, moe.first_k_dense_replace) == (512, 512, 1)
    assert moe.routed_scaling_factor == 2.5 and moe.use_qk_norm and not moe.qkv_bias


def test_llada_1_5_head_is_untied():
    args = LLaDAModelLM.args_from_config(LLADA_1_5)
    assert not args.tie_word_embeddings and args.norm_eps == 1e-5


@pytest.mark.parametrize("fields", [{"rope": False}, {"alibi": True}, {"rope": False, "alibi": True}])
def test_llada_without_rotary_positions_is_refused(fields):
    """The reference adds a learned position table (rope false) or ALiBi instead of rotating; a config
    asking for either is refused rather than loaded as RoPE."""
    with pytest.raises(CheckpointError, match="rope: false or alibi: true"):
        LLaDAModelLM.args_from_config({**LLADA_1_5, **fields})


def test_dream_with_another_activation_is_refused():
    """Dream's reference MLP is ACT2FN[hidden_act]; only silu (SwiGLU) is built here."""
    config = read_config(FIXTURES / "parity" / "dream-tiny")
    assert DreamModel.args_from_config(config).hidden_size == config["hidden_size"]
    with pytest.raises(CheckpointError, match="hidden_act 'gelu'"):
        DreamModel.args_from_config({**config, "hidden_act": "gelu"})


def test_sdar_without_head_dim_gets_the_reference_configs_128():
    """SDARConfig defaults head_dim to 128 and modeling_sdar.py reads that, not hidden / heads (80 for
    SDAR-4B): a config.json without the field still builds 128-wide heads."""
    config = {k: v for k, v in SDAR_4B_CHAT.items() if k != "head_dim"}
    assert SDARForCausalLM.args_from_config(config).head_dim == 128
    assert SDARForCausalLM.args_from_config({**config, "head_dim": None}).head_dim == 128


def built(family, config):
    with torch.device("meta"):
        return from_config_json(family.from_config, config)


def shapes(model) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", NAMES)
def test_builds_at_full_size_on_meta(name):
    config, family, facts = VARIANTS[name]
    model = built(family, config)
    assert all(p.is_meta for p in model.parameters())
    got = shapes(model)
    d, v = facts["hidden_size"], facts["vocab_size"]
    embeddings = ("wte.weight", "embed_tokens.weight", "word_embeddings.weight")
    embed = next(s for n, s in got.items() if n.endswith(embeddings))
    assert embed == (v, d)
    assert model.args.num_layers == facts["num_layers"]


# Scaling a published config down: widths / 32, attention heads / 4 (the query/key-value ratio kept),
# head sizes / 8, 2 layers, 16 experts, vocabulary 1024 with the token ids moved into it. Field names
# and every other field stay as published.
WIDTHS = ("d_model", "hidden_size", "intermediate_size", "mlp_hidden_size", "moe_intermediate_size")
HEADS = ("n_heads", "n_kv_heads", "num_attention_heads", "num_key_value_heads")
HEAD_SIZES = ("head_dim", "rotary_dim")
LAYERS = ("n_layers", "num_hidden_layers")
TINY_VOCAB = 1024


def tiny_ids(config: dict) -> dict[int, int]:
    """Each token id the config names -> a distinct id at the top of the tiny vocabulary."""
    ids = set()
    for key, value in config.items():
        if key.endswith("token_id") and value is not None:
            ids.update(value if isinstance(value, list) else [value])
    return {old: TINY_VOCAB - 1 - rank for rank, old in enumerate(sorted(ids))}


def shrink(config: dict) -> dict:
    out, remap = dict(config), tiny_ids(config)
    for key in WIDTHS:
        if key in out:
            assert out[key] % 32 == 0, key
            out[key] //= 32
    for key in HEADS:
        if key in out:
            out[key] //= 4
    for key in HEAD_SIZES:
        if key in out:
            out[key] //= 8
    for key in LAYERS:
        if key in out:
            out[key] = 2
    if "num_experts" in out:
        out["num_experts"] = 16
    for key in ("vocab_size", "embedding_size"):
        if key in out:
            out[key] = TINY_VOCAB
    for key, value in config.items():
        if key.endswith("token_id") and value is not None:
            out[key] = [remap[i] for i in value] if isinstance(value, list) else remap[value]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_tiny_version_builds_on_meta(name):
    config, family, facts = VARIANTS[name]
    small = shrink(config)
    remap = tiny_ids(config)
    args = from_config_json(family.args_from_config, small)
    assert args.hidden_size == facts["hidden_size"] // 32
    assert (args.num_layers, args.vocab_size) == (2, TINY_VOCAB)
    assert (args.num_heads, args.num_kv_heads) == (facts["num_heads"] // 4, facts["num_kv_heads"] // 4)
    assert args.num_heads // args.num_kv_heads == facts["num_heads"] // facts["num_kv_heads"]
    assert args.head_dim == facts["head_dim"] // 8
    assert args.block_size == facts["block_size"]
    mask = facts["mask_token_id"]
    assert args.mask_token_id == (None if mask is None else remap[mask])
    model = built(family, small)
    got = shapes(model)
    assert all(p.is_meta for p in model.parameters())
    assert len({n.split(".layers.")[1].split(".")[0] for n in got if ".layers." in n}
               | {n.split(".blocks.")[1].split(".")[0] for n in got if ".blocks." in n}) == 2


def test_tiny_sdar_keeps_a_head_size_that_is_not_hidden_over_heads():
    """SDAR-4B's heads are 128 wide though 2560 / 32 = 80: the tiny version keeps that, so q_proj is
    [heads * head_dim, hidden], not square."""
    model = built(SDARForCausalLM, shrink(SDAR_4B_CHAT))
    q = model.model.layers[0].self_attn.q_proj.weight
    assert tuple(q.shape) == (8 * 16, 80)


def test_tiny_llada2_keeps_one_dense_layer_then_moe():
    model = built(LLaDA2MoeModelLM, shrink(LLADA2_1_MINI))
    dense, moe = model.model.layers[0].mlp, model.model.layers[1].mlp
    assert tuple(dense.gate_proj.weight.shape) == (5120 // 32, 2048 // 32)
    assert tuple(moe.experts.gate_proj.shape) == (16, 512 // 32, 2048 // 32)
    assert model.args.rotary_dim == 8 == model.args.head_dim // 2


def test_llada_reads_weight_tying_and_include_bias_as_its_reference_does():
    """LLaDA's reference ModelConfig defaults ``weight_tying`` to True (the releases write false) and
    ``include_bias`` puts a bias on every linear layer, which is refused rather than loaded as q/k/v only."""
    from dlm_backend.errors import CheckpointError

    config = {k: v for k, v in read_config(FIXTURES / "parity" / "llada-tiny").items() if k != "weight_tying"}
    assert LLaDAModelLM.args_from_config(config).tie_word_embeddings is True
    assert LLaDAModelLM.args_from_config({**config, "weight_tying": False}).tie_word_embeddings is False
    with pytest.raises(CheckpointError, match="include_bias"):
        LLaDAModelLM.from_config({**config, "include_bias": True})


def test_dream_attends_fully_with_use_sliding_window_as_its_reference_does():
    """Dream's reference only warns about use_sliding_window (its SDPA attention ignores it): the
    engine loads it and gives the same logits."""
    from dlm_backend.engine.checkpoint.weights import load_model
    from tests.helpers import forward

    folder = FIXTURES / "parity" / "dream-tiny"
    config = read_config(folder)
    plain = load_model(folder, config, torch.device("cpu"), torch.float32)
    windowed = load_model(folder, {**config, "use_sliding_window": True, "sliding_window": 4},
                          torch.device("cpu"), torch.float32)
    ids = torch.arange(3, 19)
    torch.testing.assert_close(forward(windowed, ids), forward(plain, ids), rtol=0, atol=0)
