"""Impossible requests are refused with a DLMError that says what to change."""

import pytest
import torch
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
    ({"seed": 2**64}, r"seed must be in \[-2\*\*63, 2\*\*64\)"),
    ({"seed": -2**63 - 1}, "seed must be in"),
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


# -- found by driving the API and CLI with odd input; each was a traceback or a leak --

def test_text_that_is_not_utf8_is_encoded_not_a_type_error():
    llm = LLM()
    ids = llm.tokenizer.encode("a\udcffb")              # argv/stdin keep undecodable bytes like this
    assert ids == llm.tokenizer.encode("a\ufffdb")
    assert llm.generate("a\udcffb", SamplingParams(max_tokens=4, block_length=4))[0].finish_reason


@pytest.mark.parametrize("kwargs,match", [
    ({"prompt_token_ids": [[1, 2], 5]}, "list of token ids or a list of such lists"),
    ({"prompt_token_ids": [1.0, 2.0]}, "list of token ids or a list of such lists"),
    ({"prompts": [1, 2, 3]}, "pass token ids as prompt_token_ids"),
])
def test_misshaped_prompts_are_named(kwargs, match):
    with pytest.raises(DLMError, match=match):
        LLM().generate(**kwargs)


def test_no_request_outlives_a_failed_or_unread_call():
    """A refused second prompt left the first running, and so did a stream never iterated: each was
    batched with every later call (a 0.009 s request took 0.42 s)."""
    llm = LLM()
    params = SamplingParams(max_tokens=8, block_length=8)
    ids = llm.tokenizer.encode("hi")
    with pytest.raises(DLMError, match="Prompt token ids must be integers"):
        llm.generate(prompt_token_ids=[ids, [10**9]], sampling_params=params)
    assert not llm.engine.has_unfinished
    stream = llm.stream("hi", params)
    assert not llm.engine.has_unfinished
    del stream
    with pytest.raises(DLMError, match="must be integers"):
        llm.stream(prompt_token_ids=[10**9], sampling_params=params)       # still refused at the call


def test_chat_takes_openai_content_parts():
    llm = LLM()
    params = SamplingParams(max_tokens=8, block_length=8)
    parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "Hello"}]}], params)
    plain = llm.chat([{"role": "user", "content": "Hello"}], params)
    assert parts.token_ids == plain.token_ids
    with pytest.raises(DLMError, match="content must be a string or a list"):
        llm.chat([{"role": "user", "content": 5}], params)


def test_devices_the_machine_lacks_are_named():
    with pytest.raises(DLMError, match="not a device name"):
        LLM(device="foo")
    if not torch.cuda.is_available():
        with pytest.raises(DLMError, match="no CUDA GPU"):
            LLM(device="cuda")
