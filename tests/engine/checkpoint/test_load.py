"""A checkpoint's own decoding defaults (generation_config.json's ``dlm_sampling``) reach every front end."""

import json
import shutil

import pytest
from tests.helpers import PARITY

from dlm_backend import LLM, SamplingParams
from dlm_backend.chat import request_params
from dlm_backend.engine.params import DEFAULTS
from dlm_backend.engine.sampling_defaults import checkpoint_defaults
from dlm_backend.errors import SamplingParamsError


def _with_defaults(tmp_path, defaults) -> str:
    folder = tmp_path / "llada"
    shutil.copytree(PARITY / "llada-tiny", folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    config["dlm_sampling"] = defaults
    path.write_text(json.dumps(config))
    return str(folder)


def test_checkpoint_defaults_read_and_validated():
    assert checkpoint_defaults({}) == {}
    assert checkpoint_defaults({"dlm_sampling": {"block_length": 4, "cache": "prefix"}}) == {
        "block_length": 4, "cache": "prefix"}
    with pytest.raises(SamplingParamsError, match="has max_tokens, seed, steps, which a checkpoint cannot set"):
        checkpoint_defaults({"dlm_sampling": {"seed": 1, "max_tokens": 9, "steps": 4}})
    with pytest.raises(SamplingParamsError, match="gen.json: 'dlm_sampling' is invalid.*cache must be one of"):
        checkpoint_defaults({"dlm_sampling": {"cache": "paged"}}, "gen.json")
    with pytest.raises(SamplingParamsError, match="must be an object"):
        checkpoint_defaults({"dlm_sampling": [4]})


def test_bad_checkpoint_defaults_fail_at_load(tmp_path):
    with pytest.raises(SamplingParamsError, match="generation_config.json.*block_length must be"):
        LLM(_with_defaults(tmp_path / "a", {"block_length": 0})).engine
    with pytest.raises(SamplingParamsError, match="generation_config.json: 'dlm_sampling' names a sampler that is "
                                                  "not registered. Unknown sampler 'treshold'. Registered samplers: "
                                                  "diffusiongemma, dream"):
        LLM(_with_defaults(tmp_path / "b", {"sampler": "treshold"})).engine


def sampling_params(llm, fields, call):
    return request_params(llm, fields, call, taken=("cache",))


def test_layers_table_then_checkpoint_then_fields_then_call(tmp_path):
    plain = LLM(str(PARITY / "llada-tiny"))
    assert plain.sampling_params() == SamplingParams() == DEFAULTS
    p = sampling_params(plain, {}, {})
    assert (p.max_tokens, p.block_length, p.cache) == (256, None, "dual")     # None: the sampler's block (32)

    llm = LLM(_with_defaults(tmp_path, {"block_length": 4, "cache": "prefix", "threshold": 0.8}))
    assert llm.sampling_params(max_tokens=16) == SamplingParams(max_tokens=16, block_length=4, cache="prefix",
                                                                threshold=0.8)
    p = sampling_params(llm, {"block_length": None, "kv_cache": None, "threshold": 0.95}, {})
    assert (p.max_tokens, p.block_length, p.cache, p.threshold) == (256, 4, "prefix", 0.95)
    p = sampling_params(llm, {"kv_cache": "dual"}, {"block_length": 8})
    assert (p.block_length, p.cache, p.threshold) == (8, "dual", 0.8)


def test_another_sampler_drops_the_checkpoint_defaults_and_cfg_gets_its_cache(tmp_path):
    llm = LLM(_with_defaults(tmp_path, {"sampler": "threshold", "block_length": 4, "cache": "prefix", "threshold": 0.8}))
    assert llm.sampling_params(sampler="dream") == SamplingParams(sampler="dream")     # dream's whole-canvas block
    p = sampling_params(llm, {}, {"sampler": "llada"})
    assert (p.sampler, p.block_length, p.cache, p.threshold) == ("llada", None, "dual", 0.9)
    p = sampling_params(llm, {"sampler": "threshold"}, {})
    assert (p.block_length, p.cache, p.threshold) == (4, "prefix", 0.8)
    assert llm.sampling_params(sampler="llada", cfg_scale=1.0).cache == "none"        # CFG recomputes the canvas
    assert sampling_params(llm, {}, {"cfg_scale": 1.0}).cache == "none"
    with pytest.raises(SamplingParamsError, match="cfg_scale > 0 needs cache='none'"):
        llm.sampling_params(cfg_scale=1.0, cache="dual")                               # the caller's own choice


def test_defaults_that_name_no_sampler_hold_for_every_sampler(tmp_path):
    llm = LLM(_with_defaults(tmp_path, {"block_length": 8, "cache": "prefix"}))
    for sampler in ("llada", "threshold"):
        p = sampling_params(llm, {}, {"sampler": sampler})
        assert (p.sampler, p.block_length, p.cache) == (sampler, 8, "prefix")


def test_llm_methods_without_params_use_the_checkpoint_defaults(tmp_path, monkeypatch):
    llm = LLM(_with_defaults(tmp_path, {"sampler": "llada", "block_length": 4}))
    submitted = []
    admit = llm.engine.admit
    monkeypatch.setattr(llm.engine, "admit", lambda ids, params, *a, **k: (submitted.append(params),
                                                                          admit(ids, params, *a, **k))[1])
    out = llm.generate(prompt_token_ids=[[1, 2, 3, 4]])[0]
    list(llm.stream(prompt_token_ids=[1, 2, 3]))
    assert [(p.sampler, p.block_length) for p in submitted] == [("llada", 4)] * 2
    assert out.num_forward_passes == 256      # llada, one token per pass over the 256-slot canvas
    llm.generate(prompt_token_ids=[[1, 2]], sampling_params=SamplingParams(max_tokens=8))
    assert (submitted[-1].sampler, submitted[-1].block_length) == ("threshold", None)   # by hand: as given


def test_a_chat_request_without_params_uses_the_checkpoint_defaults(dream_chat, tmp_path):
    from dlm_backend.chat import ChatRequest, Plan

    folder = tmp_path / "dream"
    shutil.copytree(dream_chat, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "dlm_sampling": {"block_length": 8}}))
    plan = Plan(LLM(str(folder)), ChatRequest([{"role": "user", "content": "hi"}]))
    assert plan.params.block_length == 8


def test_shipped_model_names_its_defaults():
    p = LLM().sampling_params()
    assert (p.sampler, p.threshold, p.block_length, p.cache) == ("threshold", 0.95, 4, "prefix")


def test_unknown_knobs_are_refused_with_the_nearest_name(tmp_path):
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(SamplingParamsError, match="Unknown request field 'thresold'. Did you mean 'threshold'"):
        sampling_params(llm, {}, {"thresold": 0.5})
    with pytest.raises(SamplingParamsError, match="Unknown request field 'cache'. Did you mean 'kv_cache'"):
        sampling_params(llm, {}, {"cache": "dual"})          # the framework's own name
    assert sampling_params(llm, {}, {"kv_cache": "none", "gen_length": 8}).cache == "none"

