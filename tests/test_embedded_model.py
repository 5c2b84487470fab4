"""The shipped dlm-tiny: loads through the normal path, is the default, answers held-out prompts."""

import pytest

from dlm_backend import LLM, SamplingParams
from dlm_backend.chat import parse_tool_calls
from dlm_backend.engine.loader import EMBEDDED_MODEL
from dlm_backend.training.evaluate import held_out, score

pytestmark = pytest.mark.skipif(not (EMBEDDED_MODEL / "model.safetensors").is_file(),
                                reason="the embedded model is not built (run `dlm train`)")

GREEDY = SamplingParams(sampler="llada", max_tokens=64, block_length=32, steps=64)
FAST = SamplingParams(sampler="threshold", threshold=0.9, max_tokens=64, block_length=32, cache="dual")


def test_checkpoint_is_small_and_hub_shaped():
    names = {p.name for p in EMBEDDED_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    assert sum(p.stat().st_size for p in EMBEDDED_MODEL.iterdir()) < 40 * 2**20


def test_default_model_is_the_embedded_one():
    llm = LLM()
    assert llm.engine.folder == EMBEDDED_MODEL and llm.engine.architecture == "DreamModel"


@pytest.mark.parametrize("family", ["qa", "tool_call", "json", "chat", "tool_result"])
def test_answers_held_out_prompts(family):
    llm = LLM()
    examples = [e for e in held_out(8) if e.family == family][:4]
    outputs = llm.generate(prompt_token_ids=[llm.encode_chat(e.messages, tools=e.tools) for e in examples],
                           sampling_params=GREEDY)
    scores = [score(e, o.text)["exact"] for e, o in zip(examples, outputs)]
    assert sum(scores) >= 3, [(e.target, o.text) for e, o in zip(examples, outputs)]


def test_tool_call_with_fast_decoding():
    llm = LLM()
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    out = llm.chat([{"role": "user", "content": "What's the weather in Kyoto?"}], FAST, tools=tools)
    _, calls, bad = parse_tool_calls(out.text)
    assert calls == [{"name": "get_weather", "arguments": {"city": "Kyoto"}}] and not bad
    assert out.num_forward_passes < out.num_generated_tokens
