"""Impossible requests are refused with a DLMError that says what to change."""

import pytest
from helpers import PARITY

from dlm_backend import LLM, DLMError, SamplingParams
from dlm_backend.errors import ContextLengthError, SamplingParamsError, TokenizerError


@pytest.mark.parametrize("kwargs,match", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"block_length": 0}, "block_length"),
    ({"steps": -1}, "steps"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"threshold": 0}, "threshold"),
    ({"cache": "paged"}, "cache must be one of none, prefix, dual"),
    ({"remasking": "oops"}, "remasking"),
    ({"alg": "oops"}, "alg"),
    ({"cfg_scale": 1.0, "cache": "dual"}, "cfg_scale > 0 needs cache='none'"),
    ({"stop": [""]}, "stop"),
    # wrong types, as a JSON body sends them: a named 400, not a TypeError (a 500)
    ({"threshold": "0.9"}, "threshold must be a number, got '0.9'"),
    ({"cfg_scale": "1"}, "cfg_scale must be a number"),
    ({"temperature": None}, "temperature must be a number"),
    ({"top_p": "1"}, "top_p must be a number"),
    ({"ignore_eos": "false"}, "ignore_eos must be true or false"),
    ({"stop": 5}, "stop must be a string or a list"),
    # past torch.Generator's range: an overflow inside the engine, reported as an engine failure
    ({"seed": 2**64}, r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"),
    ({"seed": -2**63 - 1}, "seed must be an integer in"),
])
def test_invalid_sampling_params(kwargs, match):
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(**kwargs)


def test_unknown_sampler_lists_registered():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(SamplingParamsError, match="Unknown sampler 'nope'.*dream.*llada.*threshold"):
        llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(sampler="nope"))


def test_prompt_over_context_window():
    llm = LLM(str(PARITY / "llada-tiny"))            # max_sequence_length 512
    with pytest.raises(ContextLengthError, match="over the model's context of 512"):
        llm.generate(prompt_token_ids=[[1] * 500], sampling_params=SamplingParams(max_tokens=64))


def test_bad_prompt_ids_and_empty_prompt():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(DLMError, match=r"\[0, 320\)"):
        llm.generate(prompt_token_ids=[[1, 999]])
    with pytest.raises(DLMError, match="empty"):
        llm.generate(prompt_token_ids=[[]])


def test_text_prompt_without_tokenizer():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        llm.generate("hello")


def test_engine_keeps_serving_after_bad_requests():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(DLMError):
        llm.generate(prompt_token_ids=[[1] * 600])
    out = llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(max_tokens=8))[0]
    assert len(out.token_ids) <= 8 and out.num_forward_passes >= 1
