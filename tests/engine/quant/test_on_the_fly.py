"""``quantization=`` on full-precision checkpoints: every weight a layer lets be quantized is, each in
its place (checked product by product against its own float weight), the rest stays as published,
every family decodes, the memory report shrinks, and two ranks run the one-device quantized model."""

import pytest
import torch
import torch.nn.functional as F
from tests.helpers import FIXTURES, PARITY

from dlm_backend import LLM
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.forward.batch import ForwardBatch
from dlm_backend.engine.quant.experts import QuantizedExperts, is_quantized
from dlm_backend.engine.quant.methods import HEAD_METHODS, METHODS, is_head, quantizable, quantize_weight
from dlm_backend.engine.quant.weight import QuantizedWeight
from dlm_backend.errors import DLMError

MODELS = {
    "llada": (PARITY / "llada-tiny", {}),
    "dream": (PARITY / "dream-tiny", {}),
    "llada_moe": (PARITY / "llada-moe-tiny", {"mask_token_id": 300}),
    "llada2": (FIXTURES / "parity-block" / "llada2-tiny", {"mask_token_id": 494}),
    "sdar": (FIXTURES / "parity-block" / "sdar-tiny", {}),
    "fastdllm2": (FIXTURES / "parity-block" / "fastdllm2-tiny", {"mask_token_id": 1}),
    "diffusiongemma": (FIXTURES / "parity-block" / "diffusiongemma-tiny", {}),
}
CPU = torch.device("cpu")


def _load(name, quantization=None):
    folder, overrides = MODELS[name]
    return load_model(folder, {**read_config(folder), **overrides}, CPU, torch.float32, quantization=quantization)


def _weights(model, method="int8"):
    """Each name ``method`` quantizes -> its weight ([N, K], or a stack's experts), as installed."""
    out = {}
    for name, (module, attr) in quantizable(model).items():
        if _method(module, method) is None:
            continue
        value = getattr(module, attr, None)
        if value is None:                           # DiffusionGemma keeps its fused gate/up split in halves
            value = module.gate_up
        out[name] = value
    return out


def _method(module, method):
    return HEAD_METHODS[method] if is_head(module) else method


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("name", list(MODELS))
def test_each_quantizable_weight_is_quantized_in_its_place_and_the_rest_stays_float(name, method):
    full, quant = _load(name), _load(name, method)
    x = torch.randn(5, 1, generator=torch.Generator().manual_seed(0))
    heads = 0
    for wname, got in _weights(quant, method).items():
        want = full.get_parameter(wname)
        module = quantizable(quant)[wname][0]
        heads += is_head(module)
        assert is_quantized(got) or all(isinstance(e, QuantizedExperts) for e in got), wname
        pairs = [(got, want)] if isinstance(got, QuantizedWeight) else \
                [(e, want[i]) for i, e in enumerate(got)] if isinstance(got, QuantizedExperts) else \
                [(e, w) for half, w_half in zip(got, want.split(want.shape[1] // 2, 1)) for e, w in zip(half, w_half)]
        for q, w in pairs:
            # The installed weight's product is the product with this weight quantized, not another's.
            h = x.expand(5, w.shape[1]) * torch.linspace(-1, 1, w.shape[1])
            ref = quantize_weight(w, _method(module, method)).prepare(CPU, torch.float32)
            assert torch.equal(F.linear(h, q), F.linear(h, ref)), wname
    left = {n: p for n, p in quant.named_parameters()}
    assert left and all(p.dtype == torch.float32 for p in left.values())          # norms, embeddings, router
    assert not any(n in left for n in _weights(quant, method))
    # An untied head is quantized by HEAD_METHODS (int8 for the integer methods); a tied one is the
    # embedding, which stays float.
    untied = not quant.args.tie_word_embeddings
    assert heads == (1 if untied and HEAD_METHODS[method] else 0)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("name", ["llada", "sdar", "diffusiongemma"])
def test_every_family_decodes_quantized(name, method):
    folder, overrides = MODELS[name]
    with LLM(str(folder), device="cpu", config_overrides=overrides, quantization=method) as llm:
        out = llm.generate(prompt_token_ids=[[5, 6, 7, 8, 9]],
                           sampling_params=llm.sampling_params(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
        assert len(out.token_ids) == 8
        assert llm.engine.memory.quantized


def test_the_memory_report_shows_the_weights_shrink():
    folder = str(MODELS["llada"][0])
    sizes = {}
    for method in (None, "int8", "int4"):
        with LLM(folder, device="cpu", quantization=method) as llm:
            sizes[method] = llm.engine.memory.weight_bytes
            assert str(llm.engine.memory).startswith("weights ")
    assert sizes["int4"] < sizes["int8"] < sizes[None]


def test_an_unknown_method_is_an_error_listing_the_methods():
    with pytest.raises(DLMError, match="quantization 'int3' is not a method.*int8, int4, fp8"):
        EngineConfig(model="x", quantization="int3")


def test_two_ranks_run_the_one_device_quantized_weights():
    """Quantized whole, then split: the ranks' slices are the one-device weights, so tokens agree."""
    folder, overrides = MODELS["llada"]
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42]]
    runs = []
    for tp in (1, 2):
        with LLM(str(folder), device="cpu", config_overrides=overrides, quantization="int8",
                 tensor_parallel_size=tp, prefix_caching=False) as llm:
            params = llm.sampling_params(temperature=0.0, max_tokens=8, ignore_eos=True)
            runs.append([o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)])
    assert runs[0] == runs[1]


def test_rank_zero_holds_slices_of_the_one_device_quantized_weights_and_experts():
    """SDAR's MoE on two ranks, int8: each column-parallel weight is the top half of the one-device
    quantized rows, each row-parallel one the left half of its columns (same levels, same per-row
    scales), and rank 0's experts are the first half of the one-device stack."""
    folder, overrides = MODELS["sdar"]
    ids = list(range(3, 23))
    batch = ForwardBatch(ids=ids, positions=list(range(len(ids))), plain=[(0, len(ids), 0, 4)],
                         logit_rows=list(range(len(ids))), stat_rows=[], exclude_id=-1)
    with LLM(str(folder), device="cpu", config_overrides=overrides, quantization="int8") as solo, \
            LLM(str(folder), device="cpu", config_overrides=overrides, quantization="int8",
                tensor_parallel_size=2) as split, torch.inference_mode():
        one, rank0 = _weights(solo.engine.runner.model), _weights(split.engine.runner.model)
        checked = 0
        for name, w in one.items():
            mine = rank0[name]
            if isinstance(w, QuantizedExperts):
                pairs = [(mine[i], w[i]) for i in range(len(mine))]
                assert len(mine) == len(w) // 2
            else:
                pairs = [(mine, w)]
            for a, b in pairs:
                N, K = a.shape
                if (N, K) == tuple(b.shape):
                    assert torch.equal(a.q, b.q) and torch.equal(a.scale, b.scale), name
                elif N < b.shape[0]:                                       # column-parallel: rows
                    assert torch.equal(a.q, b.q[:N]) and torch.equal(a.scale, b.scale[:N]), name
                else:                                                      # row-parallel: columns
                    assert torch.equal(a.q, b.q[:, :K]) and torch.equal(a.scale, b.scale), name
                checked += 1
        assert checked > 20
        want, got = solo.engine.runner.execute(batch)[0], split.engine.runner.execute(batch)[0]
    # The CPU kernels round each rank's partial sum to bf16 before the all-reduce (one device rounds
    # the whole sum once); this fixture's random layers amplify that to 3% of the largest logit
    # (a bf16 model differs from float32 as much), so the logits are compared at 5%.
    assert (got - want).abs().max().item() <= 5e-2 * want.abs().max().item()
