"""Each framework's token-counting hook counts what the engine reports as ``usage.prompt_tokens``:
the model's own tokenizer over the prompt its chat template renders (tools included).

LangChain's default ``get_num_tokens_from_messages`` gave 13 for a prompt of 37 (the message texts
with GPT-2's tokenizer, no template); ``litellm.token_counter(model="dlm/...")`` used tiktoken.
"""

import importlib.util
import os

import pytest

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
KNOBS = {"max_tokens": 8, "block_length": 8}


@pytest.fixture(params=["dream", "llada"])
def checkpoint(request, dream_chat, llada_chat):
    """Dream's template writes a tool listing; LLaDA's does not, so tools go in as text."""
    return str(dream_chat if request.param == "dream" else llada_chat)


def langchain_conversations():
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    call = {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_1", "type": "tool_call"}
    return {"plain": ([SystemMessage("You are terse."), HumanMessage("What is the capital of France?")], None),
            "tools": ([HumanMessage("Weather in Oslo?")], [WEATHER]),
            "tool turns": ([HumanMessage("Weather in Oslo?"), AIMessage("", tool_calls=[call]),
                            ToolMessage("sunny", tool_call_id="call_1")], [WEATHER])}


@pytest.mark.parametrize("case", ["plain", "tools", "tool turns"])
def test_langchain_counts_the_prompt_the_engine_reports(checkpoint, case):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    messages, tools = langchain_conversations()[case]
    model = ChatDLM(model=checkpoint, **KNOBS)
    counted = model.get_num_tokens_from_messages(messages, tools=tools)
    runnable = model.bind_tools(tools) if tools else model
    assert counted == runnable.invoke(messages).usage_metadata["input_tokens"]
    model.close()


def test_langchain_trim_messages_counts_with_the_model(dream_chat):
    """trim_messages(token_counter=model) keeps what fits the model's own count of the template."""
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage, trim_messages

    from dlm_backend.adapters.langchain import ChatDLM

    model = ChatDLM(model=str(dream_chat), **KNOBS)
    history = [HumanMessage(f"question {i} " * 5) if i % 2 == 0 else AIMessage(f"answer {i} " * 5) for i in range(10)]
    budget = model.get_num_tokens_from_messages(history[-4:])
    kept = trim_messages(history, max_tokens=budget, token_counter=model, strategy="last")
    assert kept == history[-4:]
    assert model.invoke(kept).usage_metadata["input_tokens"] == budget
    model.close()


def test_litellm_counts_with_the_model(checkpoint):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    import dlm_backend.adapters.litellm as provider
    from dlm_backend.adapters.common import model_tokenizer

    model = f"dlm/{checkpoint}"
    hi = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is the capital of France?"}]
    for messages, tools in ((hi, None), (hi[1:], [WEATHER])):
        reply = litellm.completion(model=model, messages=messages, tools=tools, **KNOBS)
        assert provider.token_counter(model, messages, tools) == reply.usage.prompt_tokens
    # LiteLLM's own counter takes the model's tokenizer through its custom_tokenizer hook
    text = "Diffusion language models denoise a canvas."
    ours = len(model_tokenizer(checkpoint).encode(text))
    assert litellm.token_counter(model=model, custom_tokenizer=provider.tokenizer(model), text=text) == ours
    assert litellm.token_counter(model=model, text=text) != ours            # tiktoken, without the hook


@pytest.mark.parametrize("tool_choice", ["get_weather", "required"])
def test_forced_calls_report_the_prompt_once_at_every_door(dream_chat, tool_choice):
    """A forced call takes several generations (a name pass, a pass a value); LangChain reported
    input_tokens 1,788 for a counted prompt of 272 and LiteLLM 2,103 for its own count of 266, since
    each generation's prompt was summed. Usage is the prompt as counted, once, and at most
    max_tokens completion tokens, at every door."""
    pytest.importorskip("langchain_core")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    from langchain_core.messages import HumanMessage

    import dlm_backend.adapters.litellm as provider
    from dlm_backend.adapters.langchain import ChatDLM

    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    model = ChatDLM(model=str(dream_chat), max_tokens=96)
    counted = model.get_num_tokens_from_messages([HumanMessage(messages[0]["content"])], tools=[WEATHER])
    usage = model.bind_tools([WEATHER], tool_choice=tool_choice).invoke(messages[0]["content"]).usage_metadata
    assert usage["input_tokens"] == counted and 0 < usage["output_tokens"] <= 96
    model.close()
    reply = litellm.completion(model=f"dlm/{dream_chat}", messages=messages, tools=[WEATHER],
                               tool_choice=tool_choice, max_tokens=96)
    assert reply.usage.prompt_tokens == provider.token_counter(f"dlm/{dream_chat}", messages, [WEATHER]) == counted
    assert 0 < reply.usage.completion_tokens <= 96
    if importlib.util.find_spec("llama_index") is not None:
        from llama_index.core.base.llms.types import ChatMessage

        from dlm_backend.adapters.llamaindex import DLM

        llm = DLM(model=str(dream_chat), max_tokens=96)
        usage = llm.chat([ChatMessage(role="user", content=messages[0]["content"])], tools=[WEATHER],
                         tool_choice=tool_choice).raw["usage"]
        assert usage["prompt_tokens"] == counted and 0 < usage["completion_tokens"] <= 96
        llm.close()
    if importlib.util.find_spec("fastapi") is not None:
        import httpx
        from tests.helpers import serve_in_thread

        from dlm_backend.server import create_app

        with serve_in_thread(create_app(str(dream_chat), served_name="tiny")) as url:
            usage = httpx.post(url + "/v1/chat/completions", timeout=120, json={
                "model": "tiny", "messages": messages, "tools": [WEATHER], "tool_choice": tool_choice,
                "max_tokens": 96}).json()["usage"]
        assert usage["prompt_tokens"] == counted and 0 < usage["completion_tokens"] <= 96
