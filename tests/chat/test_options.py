"""A front door's call arguments (chat/options.py): knobs layered over the checkpoint's defaults,
misspellings named, and the OpenAI fields a diffusion engine does not serve refused, not dropped.
How the layers meet a real checkpoint's defaults: tests/engine/checkpoint/test_load.py."""

import functools
from types import SimpleNamespace

import pytest

from dlm_backend import LLM
from dlm_backend.chat import UNSUPPORTED, refuse_unsupported, request_params
from dlm_backend.errors import DLMError, SamplingParamsError


def engine_with_defaults(**defaults):
    """What request_params reads of an LLM: ``sampling_params``, over its engine's decoding defaults."""
    llm = SimpleNamespace(engine=SimpleNamespace(sampling_defaults=defaults))
    llm.sampling_params = functools.partial(LLM.sampling_params, llm)
    return llm


def test_later_layers_win_and_aliases_name_their_knob():
    llm = engine_with_defaults(sampler="threshold", threshold=0.8, block_length=4)
    p = request_params(llm, {"max_new_tokens": 5, "threshold": 0.7}, {"threshold": 0.6, "block_length": None})
    assert (p.max_tokens, p.threshold, p.block_length, p.sampler) == (5, 0.6, 4, "threshold")   # None: unset
    p = request_params(llm, {"kv_cache": "prefix", "sampler": "llada"})
    assert (p.cache, p.sampler, p.threshold, p.block_length) == ("prefix", "llada", 0.9, None)  # defaults dropped


def test_a_misspelled_knob_names_the_nearest_and_where_it_was_given():
    llm = engine_with_defaults()
    with pytest.raises(SamplingParamsError, match="Unknown body field 'thresold'. Did you mean 'threshold'") as err:
        request_params(llm, {"thresold": 0.5}, where="body")
    assert err.value.param == "thresold"
    with pytest.raises(SamplingParamsError, match="Did you mean 'kv_cache'"):
        request_params(llm, {"cache": "prefix"}, taken=("cache",))             # the framework owns 'cache'


@pytest.mark.parametrize("fields", [{"n": 1}, {"n": None}, {"echo": False}, {"presence_penalty": 0},
                                    {"modalities": ["text"]}, {"temperature": 0.3}])
def test_neutral_values_of_unserved_fields_pass(fields):
    refuse_unsupported(fields)


@pytest.mark.parametrize("fields,param,says", [
    ({"n": 2}, "n", "send the requests separately"),
    ({"n": True}, "n", "n=True"),                       # True == 1, but it is not a count
    ({"echo": True}, "echo", "prepend it yourself"),
    ({"logit_bias": {"5": 10}}, "logit_bias", "not applied"),
    ({"functions": [{"name": "f"}]}, "functions", "pass tools"),
])
def test_unserved_fields_are_refused_naming_the_field(fields, param, says):
    with pytest.raises(DLMError, match=says) as err:
        refuse_unsupported(fields)
    assert err.value.param == param and f"Drop {param}" in str(err.value)
    assert param in UNSUPPORTED


@pytest.mark.parametrize("logprobs,top,legacy,want", [
    (None, None, False, None), (False, None, False, None), (True, None, False, 0), (True, 5, False, 5),
    (None, None, True, None), (0, None, True, 0), (3, None, True, 3)])
def test_openai_logprobs_fields_become_the_engine_knob(logprobs, top, legacy, want):
    from dlm_backend.chat import logprobs_knob

    assert logprobs_knob(logprobs, top, legacy) == want


@pytest.mark.parametrize("logprobs,top,legacy,says", [
    (None, 2, False, "top_logprobs needs logprobs=true"), (False, 1, False, "top_logprobs needs"),
    (True, 21, False, "from 0 to 20"), (True, True, False, "top_logprobs must be"), (2, None, False, "true or false"),
    (6, None, True, "from 0 to 5"), (True, None, True, "from 0 to 5")])
def test_openai_logprobs_fields_out_of_their_rules_are_named(logprobs, top, legacy, says):
    from dlm_backend.chat import logprobs_knob

    with pytest.raises(DLMError, match=says):
        logprobs_knob(logprobs, top, legacy)

