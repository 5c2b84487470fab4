"""WeDLM: wedlm-tiny's reference runs (Tencent's generate_wedlm over hf_compat/modeling_wedlm.py) come
out of the engine exactly, alone, batched and with prefix caching; a reordered pass is the reference's
forward; config.json is read with the reference's defaults and what is not implemented is refused."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers import FIXTURES

from dlm_backend import LLM
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.checkpoint.weights import load_model
from dlm_backend.engine.engine import LLMEngine
from dlm_backend.engine.engine_config import EngineConfig
from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context
from dlm_backend.engine.models.registry import resolve_model_class
from dlm_backend.engine.models.wedlm import ENGINE_MASK_ID, WeDLMForCausalLM
from dlm_backend.errors import CheckpointError
from dlm_backend.parity import check_fixture
from dlm_backend.parity.cases import wedlm_generate

FIXTURE = FIXTURES / "parity-block" / "wedlm-tiny"              # WeDLM-8B's layers (Qwen3)
QWEN2 = FIXTURES / "parity-block" / "wedlm-qwen2-tiny"          # WeDLM-7B's (Qwen2.5)
CASES = json.loads((FIXTURE / "cases.json").read_text())
CPU, FP32 = torch.device("cpu"), torch.float32


def _load(folder=FIXTURE):
    return load_model(folder, read_config(folder), CPU, FP32)


def _engine(prefix_caching: bool) -> LLMEngine:
    return LLMEngine(EngineConfig(str(FIXTURE), device="cpu", dtype="float32", prefix_caching=prefix_caching))


def _run(engine: LLMEngine, prompts, params) -> list:
    """Every request queued before the first step, so they share forwards; outputs in order."""
    return _drain(engine, [engine.admit(p, sp) for p, sp in zip(prompts, params)])


def _drain(engine: LLMEngine, seqs) -> list:
    for seq in seqs:
        engine.enqueue(seq)
    outputs = {}
    while engine.has_unfinished:
        for chunk in engine.step():
            if chunk.finished:
                outputs[chunk.request_id] = chunk.output
    return [outputs[seq.request_id] for seq in seqs]


def test_the_architecture_resolves_and_loads():
    assert resolve_model_class(read_config(FIXTURE)) is WeDLMForCausalLM
    model = _load()
    a = model.args
    assert (a.num_layers, a.head_dim, a.num_heads, a.num_kv_heads, a.mask_token_id) == (2, 24, 4, 2, 300)
    assert model.schedule == "wedlm" and model.logits_shift == 0 and a.block_size is None
    attn = model.model.layers[0].self_attn
    assert attn.q_norm is not None and attn.q_proj.bias is None and attn.o_proj.bias is None
    qwen2 = _load(QWEN2)
    attn = qwen2.model.layers[0].self_attn
    assert qwen2.args.head_dim == 16 and attn.q_norm is None and attn.q_proj.bias is not None
    assert attn.o_proj.bias is None


@pytest.mark.parametrize("folder", [FIXTURE, QWEN2], ids=lambda p: p.name)
def test_every_case_and_the_forwards_are_exact(folder):
    results = check_fixture(folder)
    assert [r.line() for r in results if not r.ok] == []
    cases = json.loads((folder / "cases.json").read_text())["cases"]
    assert len(results) == len(cases) + 3                  # + causal logits, a batch of two, a cached row


@pytest.mark.parametrize("folder", [FIXTURE, QWEN2], ids=lambda p: p.name)
def test_a_reordered_pass_is_the_reference_forward(folder):
    """Committed tokens first, masks last, each at its own rotary position, attention causal by row."""
    expected = load_file(str(folder / "expected_logits.safetensors"))
    model, ids, pos = _load(folder), expected["reordered.input_ids"][0], expected["reordered.position_ids"][0]
    T = len(ids)
    with torch.no_grad(), forward_context(ForwardContext(PackedAttention([Segment(slice(0, T), 0, 1)]))):
        logits = model.compute_logits(model(ids, pos))
    torch.testing.assert_close(logits, expected["reordered.logits"][0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_every_case_batched_together(prefix_caching):
    """All cases in one engine at once: each request's tokens and passes are still the reference's."""
    runs = [wedlm_generate(c, CASES) for c in CASES["cases"]]
    engine = _engine(prefix_caching)
    try:
        outs = _run(engine, [r.prompts[0] for r in runs], [r.params[0] for r in runs])
    finally:
        engine.close()
    assert [r.check([o]) for r, o in zip(runs, outs)] == [[] for _ in runs]


def test_a_shared_prompt_prefix_gives_the_same_tokens():
    """Two prompts of one case's tokens after a common 40-token head: the second request reads the
    first's cached pages and both decode as they do alone."""
    case = CASES["cases"][3]
    head = [(7 * i) % 300 for i in range(40)]
    prompts = [head + case["prompt"], head + case["prompt"][::-1]]
    params = wedlm_generate(case, CASES).params[0]
    alone = []
    for p in prompts:
        engine = _engine(False)
        try:
            alone.append(_run(engine, [p], [params])[0].token_ids)
        finally:
            engine.close()
    engine = _engine(True)
    try:
        first = _run(engine, prompts[:1], [params])[0]
        second_seq = engine.admit(prompts[1], params)
        second = _drain(engine, [second_seq])[0]
        assert second_seq.num_shared >= 2                       # 40 tokens: two full pages of 16 read back
    finally:
        engine.close()
    assert [first.token_ids, second.token_ids] == alone


def test_two_ranks_decode_every_case_exactly():
    """Over two gloo ranks each holds 2 query heads and 1 KV head; the reordered passes read each rank's
    own pages, and every case still comes out as the reference's."""
    runs = [wedlm_generate(c, CASES) for c in CASES["cases"]]
    with LLM(str(FIXTURE), device="cpu", dtype="float32", tensor_parallel_size=2) as llm:
        assert llm.engine.model.kv_shapes == ((1, 24), (1, 24))
        outs = [llm.generate(prompt_token_ids=r.prompts, sampling_params=r.params[0])[0] for r in runs]
    assert [r.check([o]) for r, o in zip(runs, outs)] == [[] for _ in runs]


def _copy(tmp_path, drop: tuple = (), **config):
    for name in ("generation_config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    c = {k: v for k, v in read_config(FIXTURE).items() if k not in drop}
    (tmp_path / "config.json").write_text(json.dumps({**c, **config}))
    return tmp_path


def test_missing_fields_take_the_reference_config_defaults():
    """WeDLMConfig's defaults: 32 layers of 4096 over 32 heads, head_dim hidden / heads, attention bias
    on, no QK-norm, the official engine's mask id."""
    args = WeDLMForCausalLM.args_from_config({})
    assert (args.vocab_size, args.hidden_size, args.num_layers, args.num_heads, args.num_kv_heads) == \
        (151936, 4096, 32, 32, 32)
    assert (args.head_dim, args.intermediate_size, args.max_positions, args.rope_theta, args.norm_eps) == \
        (128, 22016, 32768, 10000.0, 1e-6)
    assert args.mask_token_id == ENGINE_MASK_ID and not args.tie_word_embeddings
    small = {"vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
             "intermediate_size": 48}
    model = WeDLMForCausalLM.from_config(small)
    attn = model.model.layers[0].self_attn
    assert attn.q_norm is None and attn.q_proj.bias is not None and attn.o_proj.bias is None
    assert model.args.mask_token_id is None               # outside the vocabulary: the tokenizer's mask


@pytest.mark.parametrize("field,value,match", [
    ("use_sliding_window", True, "use_sliding_window"),
    ("layer_types", ["full_attention", "sliding_attention"], "layer_types"),
    ("layer_types", ["full_attention"], "layer_types"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling"),
    ("hidden_act", "gelu", "hidden_act"),
    ("qk_norm", "yes", "qk_norm"),
    ("attention_bias", 1, "attention_bias"),
    ("head_dim", 0, "head_dim"),
    ("num_key_value_heads", 3, "num_key_value_heads"),
    ("mask_token_id", 320, "mask_token_id"),              # outside the 320-token vocabulary
    ("rope_theta", 0, "rope_theta"),
])
def test_an_unsupported_or_malformed_field_is_refused_by_name(field, value, match):
    with pytest.raises(CheckpointError, match=match):
        WeDLMForCausalLM.from_config({**read_config(FIXTURE), field: value})


def test_a_sliding_window_checkpoint_is_refused_through_the_engine(tmp_path):
    folder = _copy(tmp_path, use_sliding_window=True, sliding_window=8)
    with pytest.raises(CheckpointError, match="use_sliding_window"):
        LLMEngine(EngineConfig(str(folder), device="cpu", dtype="float32"))
