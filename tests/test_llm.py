"""The user-facing LLM (dlm_backend/llm.py): prompts as text or token ids, odd input named, and no
request outliving the call that made it."""

import pytest
from tests.helpers import PARITY

from dlm_backend import LLM, DLMError, SamplingParams
from dlm_backend.errors import TokenizerError


def test_text_prompt_without_tokenizer():
    llm = LLM(str(PARITY / "llada-tiny"))
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        llm.generate("hello")


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


def test_loading_a_model_imports_no_compiler():
    """Building the model on the meta device ran torch's initialisers through its Python references,
    whose first use imports torch._dynamo: over a second of every first load, and, in the worker
    thread an async front door loads in, event-loop stalls of 100-250 ms while it held the GIL."""
    import subprocess
    import sys

    code = ("import sys; from dlm_backend import LLM; llm = LLM()\n"
            "assert llm.chat([{'role': 'user', 'content': 'hi'}], llm.sampling_params(max_tokens=4)).finish_reason\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_chat_sends_the_tools_as_the_chat_layer_does(llada_chat):
    """LLaDA's template writes no tool listing: LLM.chat handed it the tools and it dropped them (33
    tokens, no tool) where the chat layer writes them in as text (269). Every caller builds its prompt
    the one way (chat/prompt.py), so chat, stream_chat and their async forms send what a front door sends."""
    import asyncio

    from tests.chat.chat_cases import WEATHER

    from dlm_backend.chat import ChatRequest, Plan

    llm = LLM(str(llada_chat))
    assert not llm.tokenizer.renders_tools
    messages, params = [{"role": "user", "content": "weather in Oslo?"}], SamplingParams(max_tokens=4, block_length=4)
    want = Plan(llm, ChatRequest(messages, params, tools=[WEATHER])).prompt_ids
    assert "get_weather" in llm.tokenizer.decode(want, skip_special_tokens=False)

    async def async_forms():
        streamed = [c async for c in llm.astream_chat(messages, params, tools=[WEATHER])]
        return [await llm.achat(messages, params, tools=[WEATHER]), streamed[-1].output]

    outs = [llm.chat(messages, params, tools=[WEATHER]), list(llm.stream_chat(messages, params, tools=[WEATHER]))[-1].output,
            *asyncio.run(async_forms())]
    assert [o.prompt_token_ids for o in outs] == [want] * 4
    assert llm.encode_chat(messages, tools=[WEATHER]) == want


def test_quantization_reaches_the_engine_and_names_its_methods_when_wrong():
    """``LLM(quantization=...)`` builds its own engine with the weights quantized as they load (an
    int4 handle sharing a full-precision engine would run weights it did not ask for); a method the
    engine does not apply is a DLMError naming the ones it does, before anything loads."""
    from dlm_backend.engine.quant.methods import METHODS

    with LLM() as full, LLM(quantization="int4") as int4, LLM(quantization="int4") as again:
        assert int4.config.quantization == "int4" and full.config.quantization is None
        assert int4.engine is again.engine and int4.engine is not full.engine
        assert int4.engine.memory.quantized and not full.engine.memory.quantized
        assert all(kind.startswith("int4") for kind in int4.engine.memory.quantized)
        assert int4.engine.memory.weight_bytes < full.engine.memory.weight_bytes
        assert int4.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4, block_length=4)).finish_reason
    with pytest.raises(DLMError, match="quantization 'int3'") as refused:
        LLM(quantization="int3")
    assert all(name in str(refused.value) for name in METHODS)
