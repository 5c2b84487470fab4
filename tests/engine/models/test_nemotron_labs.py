"""Nemotron-Labs-Diffusion: nemotron-labs-tiny's reference runs (NVIDIA's generate, ar_generate and
linear_spec_generate) come out of the engine exactly, through every mode and batched; YaRN and the
query scale are the reference's; self-speculation keeps what the causal pass agrees with; bad config
fields are refused by name."""

import json
import math
import shutil

import pytest
import torch
from tests.helpers import FIXTURES, engine_for, run_to_end

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.checkpoint.folder import read_config
from dlm_backend.engine.layers.rotary import yarn_rope
from dlm_backend.engine.models.nemotron_labs import NemotronLabsDiffusionModel
from dlm_backend.engine.models.registry import resolve_model_class
from dlm_backend.engine.params import SamplingParams as Params
from dlm_backend.engine.requests.causal_block_sequence import CausalBlockSequence
from dlm_backend.engine.samplers import TokenInfo
from dlm_backend.engine.samplers.nemotron import NemotronSampler, NemotronSpecSampler
from dlm_backend.errors import CheckpointError, DLMError
from dlm_backend.parity import check_fixture

FIXTURE = FIXTURES / "parity-block" / "nemotron-labs-tiny"
CASES = json.loads((FIXTURE / "cases.json").read_text())
SAMPLER = {"nemotron.generate": "nemotron", "nemotron.ar_generate": "nemotron_ar",
           "nemotron.linear_spec_generate": "nemotron_spec"}


def test_the_architecture_resolves_and_reads_its_config():
    config = read_config(FIXTURE)
    assert resolve_model_class(config) is NemotronLabsDiffusionModel
    model = NemotronLabsDiffusionModel.from_config(config)
    a = model.args
    assert (a.num_layers, a.head_dim, a.num_kv_heads, a.mask_token_id, a.block_size) == (2, 16, 2, 310, 8)
    assert model.schedule == "causal_block" and model.rope["rope_type"] == "yarn"
    assert model.encoder.layers[0].self_attn.k_proj.weight.shape == (32, 48)


def test_every_case_and_the_forward_are_exact():
    results = check_fixture(FIXTURE)
    assert [r.line() for r in results if not r.ok] == []
    assert len(results) == len(CASES["cases"]) + 1                  # + the forward logits
    assert {c["sampler"] for c in CASES["cases"]} == set(SAMPLER)


@pytest.fixture(scope="module")
def llm():
    return LLM(str(FIXTURE), dtype="float32")


def _params(case: dict) -> SamplingParams:
    kw = dict(sampler=SAMPLER[case["sampler"]], max_tokens=case["max_new_tokens"], temperature=0.0,
              ignore_eos=True, stop_token_ids=[case["eos_token_id"]])
    if case["block_length"]:
        kw["block_length"] = case["block_length"]
    if case["sampler"] == "nemotron.generate":
        kw["remasking"] = "low_confidence" if case["threshold"] is None else "low_confidence_dynamic"
        kw["threshold"] = case["threshold"] or 0.9
    if case["sampler"] == "nemotron.linear_spec_generate":
        kw["options"] = {"draft_threshold": case["threshold"]}
    return SamplingParams(**kw)


def test_every_mode_batched_together_gives_each_reference_output():
    """All twelve cases queued at once: the three modes' passes packed into shared forwards."""
    engine, cases = engine_for(FIXTURE), CASES["cases"]
    try:
        ids = [engine.add_request(c["prompt"], _params(c)).request_id for c in cases]
        done = run_to_end(engine)
    finally:
        engine.close()
    for c, rid in zip(cases, ids):
        out = done[rid].output
        got = out.token_ids + ([out.stop_reason] if out.finish_reason == "stop" else [])
        assert got == c["output"][:c["max_new_tokens"]], c


def test_a_shared_prompt_prefix_gives_the_same_tokens(llm):
    """The prompt pages before its last position are shared with the prefix cache (causal keys depend
    on nothing after them); a second request over them decodes as the first."""
    c = CASES["cases"][0]
    prompt = c["prompt"] * 3
    first = llm.generate(prompt_token_ids=[prompt], sampling_params=_params(c))[0]
    again = llm.generate(prompt_token_ids=[prompt], sampling_params=_params(c))[0]
    assert first.token_ids == again.token_ids


def _spec_sequence(L=4, template=None):
    params = Params(sampler="nemotron_spec", max_tokens=12, block_length=L)
    seq = CausalBlockSequence([5, 6, 7], params, NemotronSpecSampler(), TokenInfo(mask_id=99, eos_ids=(98,)),
                              response_template=template)
    seq.apply(seq.plan(0), ar_tokens=[10])                             # prefill: the first token
    return seq


def _draft(seq, tokens):
    step = seq.plan(0)
    assert step.kind == "denoise" and step.block_size is None
    seq.apply(step, commit=type("C", (), {"indices": list(range(len(tokens))), "token_ids": tokens})())


def test_self_speculation_keeps_the_agreed_draft_and_the_model_s_next_token():
    seq = _spec_sequence()
    assert seq.canvas[3:7] == [10, 99, 99, 99] and seq.committed_token_ids == [10]
    _draft(seq, [11, 12, 13])
    assert seq.committed_token_ids == [10]                          # a draft is not output
    verify = seq.plan(0)
    assert (verify.kind, verify.block_size, verify.shift, verify.candidates) == ("cache", 1, 1, [4, 5, 6, 7])
    seq.apply(verify, ar_tokens=[11, 12, 40, 41])                   # agrees on 11, 12; then says 40
    assert seq.committed_token_ids == [10, 11, 12, 40]
    assert seq.canvas[7:] == [99] * (len(seq.canvas) - 7)           # the rejected draft is masked again
    assert (seq.num_cached, seq.block_start) == (6, 6)              # 10, 11, 12 keep their causal keys
    _draft(seq, [1, 2, 3])
    seq.apply(seq.plan(0), ar_tokens=[7, 8, 9, 0])                  # rejects at once: one new token
    assert seq.committed_token_ids == [10, 11, 12, 40, 7] and seq.num_cached == 7


def test_self_speculation_stops_at_an_end_token_the_verify_keeps():
    seq = _spec_sequence()
    _draft(seq, [11, 98, 13])
    seq.apply(seq.plan(0), ar_tokens=[11, 98, 13, 14])
    assert seq.is_finished and seq.finish_reason == "stop" and seq.committed_token_ids == [10, 11]


def test_self_speculation_never_changes_a_templated_slot():
    seq = _spec_sequence(template=[None, None, 50, None])
    _draft(seq, [11, 13])                                           # the masked slots: 4 and 6
    seq.apply(seq.plan(0), ar_tokens=[11, 70, 13, 14])              # says 70 where the template has 50
    assert seq.canvas[3:8] == [10, 11, 50, 13, 14]


def test_yarn_frequencies_are_transformers():
    """Values of transformers 5.25's ``_compute_yarn_parameters`` for the same parameters."""
    cases = [((16, 1e6, 0.25, 24, 32.0, 1.0, 1.0, 1.0),
              [1.0, 0.711311758, 0.126491114, 0.022493653, 0.00400000019, 0.000711311761, 0.000126491097,
               2.24936539e-05], 1.0),
             ((32, 1e4, 8.0, 4096, 32.0, 1.0, None, None),
              [1.0, 0.562341332, 0.316227764, 0.177827939, 0.100000001, 0.0562341288, 0.0276699308, 0.0133370962,
               0.00624999963, 0.00281170662, 0.0011858542, 0.000444569858, 0.000125000006, 7.02926627e-05,
               3.95284733e-05, 2.22284925e-05], 1.2079441541679836),
             ((32, 1e6, 16.0, 16384, 32.0, 1.0, 1.0, 0.5),
              [1.0, 0.421696514, 0.177827939, 0.0749894157, 0.0316227786, 0.0133352149, 0.00456902338,
               0.00148210872, 0.000437499984, 0.000105424115, 1.11142463e-05, 4.68683902e-06, 1.97642339e-06,
               8.33450883e-07, 3.51463342e-07, 1.48210859e-07], 1.121751143713058)]
    for args, want, factor in cases:
        inv_freq, attention_factor = yarn_rope(*args)
        torch.testing.assert_close(inv_freq, torch.tensor(want), rtol=1e-6, atol=0)
        assert math.isclose(attention_factor, factor, rel_tol=1e-12)


def test_the_query_scale_starts_past_the_original_context():
    model = NemotronLabsDiffusionModel.from_config(read_config(FIXTURE))        # original_max 24, beta 0.1
    scale = model.query_scale(torch.tensor([0, 23, 24, 47, 48]))[:, 0, 0]
    torch.testing.assert_close(scale, torch.tensor([1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2),
                                                    1 + 0.1 * math.log(3)]))
    released = {**read_config(FIXTURE), "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 0.25,
                                                            "original_max_position_embeddings": 16384}}
    assert NemotronLabsDiffusionModel.from_config(released).query_scale(torch.tensor([5])) is None


def test_older_configs_name_rope_scaling_and_rope_theta():
    c = {k: v for k, v in read_config(FIXTURE).items() if k != "rope_parameters"}
    model = NemotronLabsDiffusionModel.from_config({**c, "rope_theta": 5e5, "rope_scaling": None})
    assert model.rope == {"rope_type": "default", "rope_theta": 5e5, "llama_4_scaling_beta": 0.0}


@pytest.mark.parametrize("field,value,match", [
    ("dlm_paradigm", "block_diff", "dlm_paradigm"),
    ("hidden_act", "gelu", "hidden_act"),
    ("mlp_bias", True, "MLP biases"),
    ("sliding_window", 4096, "sliding-window"),
    ("num_key_value_heads", 3, "num_key_value_heads"),
    ("mask_token_id", 320, "mask_token_id"),
    ("block_size", 0, "block_size"),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 1e6}, "longrope"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6}, "original_max_position_embeddings"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "original_max_position_embeddings": 64}, "factor"),
    ("rope_parameters", "yarn", "rope_parameters"),
])
def test_a_malformed_field_is_refused_by_name(field, value, match):
    with pytest.raises(CheckpointError, match=match):
        NemotronLabsDiffusionModel.from_config({**read_config(FIXTURE), field: value})


def test_a_rule_that_reads_only_the_block_denoises_its_blocks(llm):
    out = llm.generate(prompt_token_ids=[[5, 6, 7, 8]], sampling_params=SamplingParams(
        sampler="threshold", threshold=0.5, max_tokens=16, ignore_eos=True))[0]
    assert len(out.token_ids) == 16 and out.num_cache_passes == 2             # the prefill and one block's keys


def test_a_sampler_of_another_decoding_is_refused(llm):
    with pytest.raises(DLMError, match="nemotron_spec"):
        llm.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=SamplingParams(sampler="llada", max_tokens=8))
    with pytest.raises(DLMError, match="remasking"):
        NemotronSampler().validate(Params(sampler="nemotron", remasking="random"))


def test_a_missing_field_is_named_through_the_engine(tmp_path):
    for name in ("generation_config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    c = {k: v for k, v in read_config(FIXTURE).items() if k != "intermediate_size"}
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(DLMError, match="intermediate_size"):
        LLM(str(tmp_path), dtype="float32")


def test_self_speculation_outputs_what_autoregressive_decoding_outputs(llm):
    """Greedy self-speculation keeps only tokens the causal pass predicts, so its output is the
    autoregressive one, in fewer passes when drafts are kept (random weights keep few)."""
    for c in CASES["cases"][:4]:
        ar, spec = (llm.generate(prompt_token_ids=[c["prompt"]], sampling_params=SamplingParams(
            sampler=s, max_tokens=20, ignore_eos=True, block_length=4))[0] for s in ("nemotron_ar", "nemotron_spec"))
        assert spec.token_ids == ar.token_ids and len(ar.token_ids) == 20
        assert ar.num_cache_passes == 20 and ar.num_forward_passes == 0
