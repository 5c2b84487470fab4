"""SDAR: forward logits match the JetAstra reference on sdar-tiny (full block-causal forward, the
cached denoise forward, a batch of two); SDAR-MoE (no published fixture) against a dense reference
on a tiny random checkpoint written here in the official per-expert layout."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from tests.helpers import FIXTURES
from safetensors.torch import load_file, save_file

from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.models.registry import supported_architectures
from dlm_backend.engine.layers.mlp import GatedMLP
from dlm_backend.engine.models.sdar import SDARForCausalLM, SDARMoeForCausalLM, SDARMoeSparseMoeBlock
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.parity.forward import PagedRun
from dlm_backend.errors import CheckpointError

FIXTURE = FIXTURES / "parity-block" / "sdar-tiny"
CASES = json.loads((FIXTURE / "cases.json").read_text())
EXPECTED = load_file(str(FIXTURE / "expected_logits.safetensors"))
L = CASES["forward"]["block_length"]
TOL = dict(atol=1e-4, rtol=1e-4)
CPU, FP32 = torch.device("cpu"), torch.float32


def load(folder):
    return load_model(folder, read_config(folder), CPU, FP32)


@pytest.fixture(scope="module")
def model():
    return load(FIXTURE)


def run(model, ids: torch.Tensor, segments: list[Segment], positions: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), forward_context(ForwardContext(PackedAttention(segments))):
        return model.compute_logits(model(ids, positions))


def full_forward(model, ids: torch.Tensor) -> torch.Tensor:
    T = len(ids)
    return run(model, ids, [Segment(slice(0, T), 0, block_size=L)], torch.arange(T))


def test_config_facts(model):
    a = model.args
    assert (a.block_size, a.mask_token_id, a.head_dim, a.rotary_dim) == (L, CASES["mask_token_id"], 16, None)
    assert Segment(slice(0, 16), 0, block_size=L).mask(16, 0, "cpu").equal(EXPECTED["block_mask"].bool())


def test_forward_logits_match_reference(model):
    torch.testing.assert_close(full_forward(model, EXPECTED["input_ids"][0]), EXPECTED["logits"][0], **TOL)


def test_cached_block_logits_match_reference(model):
    # The reference's denoise path: the first T-L tokens write the cache, the last block reads it.
    ids = EXPECTED["input_ids"][0]
    T = len(ids)
    run = PagedRun(model, T, L)
    run.forward(ids[:T - L], 0, T - L)
    logits = run.forward(ids[T - L:], T - L, T)
    torch.testing.assert_close(logits, EXPECTED["cached_block_logits"][0], **TOL)


def test_batch_of_two_matches_reference(model):
    batch = EXPECTED["batch_input_ids"]
    T = batch.shape[1]
    segments = [Segment(slice(0, T), 0, block_size=L), Segment(slice(T, 2 * T), 0, block_size=L)]
    logits = run(model, batch.reshape(-1), segments, torch.arange(T).repeat(2))
    torch.testing.assert_close(logits.view(2, T, -1), EXPECTED["batch_logits"], **TOL)


# --- SDAR-MoE -------------------------------------------------------------------------------------

E, K, D = 6, 2, 64


def moe_config(**fields) -> dict:
    c = json.loads((FIXTURE / "config.json").read_text())
    return {**c, "architectures": ["SDARMoeForCausalLM"], "model_type": "sdar_moe", "num_experts": E,
            "num_experts_per_tok": K, "moe_intermediate_size": 24, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [1], **fields}


def write_moe_checkpoint(folder, config: dict, identical: bool = False, drop: tuple = (), seed: int = 0):
    """sdar-tiny's weights with the MLP of every sparse layer replaced by a router and E experts (per-expert
    names, as the official checkpoints). ``identical``: every expert is that layer's dense MLP."""
    dense = load_file(str(FIXTURE / "model.safetensors"))
    moe = SDARMoeForCausalLM.moe_from_config(config)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, t in dense.items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if layer is None or ".mlp." not in name or not moe.sparse(layer):
            tensors[name] = t
    width = moe.moe_intermediate_size
    shapes = {"gate_proj": (width, D), "up_proj": (width, D), "down_proj": (D, width)}
    for i in range(config["num_hidden_layers"]):
        if not moe.sparse(i):
            continue
        p = f"model.layers.{i}.mlp."
        tensors[p + "gate.weight"] = torch.randn(E, D, generator=g)
        for e in range(E):
            for proj, shape in shapes.items():
                w = dense[f"{p}{proj}.weight"] if identical else torch.randn(shape, generator=g) * 0.2
                tensors[f"{p}experts.{e}.{proj}.weight"] = w.clone()
        if moe.shared_expert_intermediate_size:
            s = moe.shared_expert_intermediate_size
            for proj, shape in {"gate_proj": (s, D), "up_proj": (s, D), "down_proj": (D, s)}.items():
                tensors[f"{p}shared_expert.{proj}.weight"] = torch.randn(shape, generator=g) * 0.2
            tensors[p + "shared_expert_gate.weight"] = torch.randn(1, D, generator=g)
    tensors = {k: v for k, v in tensors.items() if not any(d in k for d in drop)}
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE / "generation_config.json", folder / "generation_config.json")
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder, tensors


def swiglu_ref(x, gate, up, down):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def dense_moe_reference(x: torch.Tensor, tensors: dict, prefix: str, config: dict) -> torch.Tensor:
    """Every expert on every token, each weighted by its router weight (0 where not chosen)."""
    probs = torch.softmax(F.linear(x, tensors[prefix + "gate.weight"]).float(), dim=-1)     # [T, E]
    top = probs.topk(K, dim=-1)
    weight = top.values / top.values.sum(-1, keepdim=True) if config["norm_topk_prob"] else top.values
    weights = torch.zeros_like(probs).scatter(1, top.indices, weight)                       # [T, E]
    out = sum(weights[:, e, None] * swiglu_ref(x, *(tensors[f"{prefix}experts.{e}.{p}.weight"]
                                                    for p in ("gate_proj", "up_proj", "down_proj")))
              for e in range(E))
    if config.get("shared_expert_intermediate_size"):
        shared = swiglu_ref(x, *(tensors[f"{prefix}shared_expert.{p}.weight"]
                                 for p in ("gate_proj", "up_proj", "down_proj")))
        out = out + torch.sigmoid(F.linear(x, tensors[prefix + "shared_expert_gate.weight"])) * shared
    return out


@pytest.mark.parametrize("fields", [{}, {"norm_topk_prob": False}, {"shared_expert_intermediate_size": 16}],
                         ids=["renormalised", "raw-softmax", "shared-expert"])
def test_moe_block_matches_dense_reference(tmp_path, fields):
    config = moe_config(**fields)
    folder, tensors = write_moe_checkpoint(tmp_path / "moe", config)
    model = load(folder)
    assert isinstance(model, SDARMoeForCausalLM)
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert kinds == [SDARMoeSparseMoeBlock, GatedMLP, SDARMoeSparseMoeBlock]     # mlp_only_layers = [1]
    x = torch.randn(40, D, generator=torch.Generator().manual_seed(1))
    for i in (0, 2):
        with torch.no_grad():
            got = model.model.layers[i].mlp(x)
        torch.testing.assert_close(got, dense_moe_reference(x, tensors, f"model.layers.{i}.mlp.", config),
                                   atol=1e-5, rtol=1e-5)


def test_moe_of_identical_experts_is_the_dense_model(tmp_path):
    # Renormalised weights sum to 1, so E copies of a layer's MLP behind any router are that MLP:
    # the whole MoE model must then reproduce the dense reference logits.
    config = moe_config(moe_intermediate_size=128, mlp_only_layers=[])
    folder, _ = write_moe_checkpoint(tmp_path / "moe", config, identical=True)
    model = load(folder)
    assert all(isinstance(layer.mlp, SDARMoeSparseMoeBlock) for layer in model.model.layers)
    torch.testing.assert_close(full_forward(model, EXPECTED["input_ids"][0]), EXPECTED["logits"][0], **TOL)


def test_moe_runs_in_bfloat16(tmp_path):
    config = moe_config(shared_expert_intermediate_size=16)
    folder, tensors = write_moe_checkpoint(tmp_path / "moe", config)
    model = load_model(folder, read_config(folder), CPU, torch.bfloat16)
    logits = full_forward(model, EXPECTED["input_ids"][0])
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    x = torch.randn(40, D, generator=torch.Generator().manual_seed(1))
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        got, (idx, weight) = mlp(x.bfloat16()), mlp.route(x.bfloat16())
    assert got.dtype == torch.bfloat16 and weight.dtype == torch.float32
    # bf16 gate logits may pick other experts for a near-tie token; compare the tokens routed alike.
    want_idx = F.linear(x, tensors["model.layers.0.mlp.gate.weight"]).topk(K, dim=-1).indices
    same = (idx.sort(-1).values == want_idx.sort(-1).values).all(-1)
    assert same.float().mean() > 0.8
    want = dense_moe_reference(x, tensors, "model.layers.0.mlp.", config)
    assert ((got.float() - want)[same].abs().max() < 0.05 * want.abs().max())


@pytest.mark.parametrize("step,only,sparse", [(1, [], [0, 1, 2]), (2, [], [1]), (1, [0, 2], [1]), (2, [1], [])])
def test_sparse_layers_follow_qwen3_moe(step, only, sparse):
    moe = SDARMoeForCausalLM.moe_from_config(moe_config(decoder_sparse_step=step, mlp_only_layers=only))
    assert [i for i in range(3) if moe.sparse(i)] == sparse


def test_missing_expert_is_refused(tmp_path):
    folder, _ = write_moe_checkpoint(tmp_path / "moe", moe_config(), drop=("layers.2.mlp.experts.4.",))
    with pytest.raises(CheckpointError, match=r"missing.*model\.layers\.2\.mlp\.experts\.down_proj\[4\]"):
        load(folder)


def test_wrong_shape_is_refused(tmp_path):
    config = moe_config()
    folder, tensors = write_moe_checkpoint(tmp_path / "moe", config)
    tensors["model.layers.0.mlp.experts.1.gate_proj.weight"] = torch.zeros(25, D)
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(D, D + 1)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"wrong shape") as err:
        load(folder)
    assert "experts.1.gate_proj.weight: expected [24, 64]" in str(err.value)
    assert "self_attn.q_proj.weight: expected [64, 64]" in str(err.value)


def test_dense_mlp_in_a_sparse_layer_is_refused(tmp_path):
    # A checkpoint that keeps a dense MLP where config.json says the layer routes.
    folder, _ = write_moe_checkpoint(tmp_path / "moe", moe_config(mlp_only_layers=[1]))
    (folder / "config.json").write_text(json.dumps(moe_config(mlp_only_layers=[])))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load(folder)


@pytest.mark.parametrize("cls,fields,match", [
    (SDARForCausalLM, {"use_sliding_window": True}, "sliding-window"),
    (SDARForCausalLM, {"hidden_act": "gelu"}, "hidden_act"),
    (SDARForCausalLM, {"block_size": None}, "block_size"),
    (SDARForCausalLM, {"block_size": 0}, "block_size"),
    (SDARForCausalLM, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    (SDARMoeForCausalLM, {"mlp_only_layers": [3]}, "mlp_only_layers"),
    (SDARMoeForCausalLM, {"mlp_only_layers": "1"}, "mlp_only_layers"),
    (SDARMoeForCausalLM, {"num_experts_per_tok": E + 1}, "num_experts_per_tok"),
    (SDARMoeForCausalLM, {"norm_topk_prob": "yes"}, "norm_topk_prob"),
])
def test_bad_configs_are_refused(cls, fields, match):
    with pytest.raises(CheckpointError, match=match):
        cls.from_config(moe_config(**fields))


def test_listed_by_dlm_models():
    table = supported_architectures()
    assert table["SDARForCausalLM"] == "dlm_backend.engine.models.sdar:SDARForCausalLM"
    assert table["SDARMoeForCausalLM"] == "dlm_backend.engine.models.sdar:SDARMoeForCausalLM"
