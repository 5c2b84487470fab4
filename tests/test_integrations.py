"""Every integration scenario runs on the embedded model, as a user would run it.

Each scenario runs once (module fixtures). One test per scenario asserts what the backend owes any
model: the framework's loop completes, tool calls parse into the framework's own objects, streams
and usage arrive, retrieval finds the passage. Further tests assert the right answers. Those that
need the model to copy an unseen name or number from its prompt (the RAG answer, the tool calls and
their arguments, the agents' final replies) pass. Two answers need skills dlm-tiny lacks: the
LiteLLM scenarios stream a sum ("12 + 30") and the OpenAI-client one a sort ("9, 4, 7"). Those
stay ``xfail`` with the measured reason (issue 3, recipes/dlm_tiny/findings.md): one sum is right at
the model's own defaults (XPASS) but is a 25% skill, and the sort is wrong.
"""

import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.helpers import WEAK_AT_ARITHMETIC, WEAK_AT_LISTS

ROOT = Path(__file__).resolve().parents[1] / "integrations"


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_calls_parse(response):
    """Any tool call in an OpenAI-shaped response names a function and has JSON-object arguments
    (with tool_choice auto the model may answer in text instead, which is its choice)."""
    for call in response.choices[0].message.tool_calls or []:
        assert call.function.name and isinstance(json.loads(call.function.arguments), dict)


def assert_called(response, name: str, argument_text: str):
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == name
    assert argument_text in choice.message.tool_calls[0].function.arguments


@pytest.fixture(scope="module")
def rag():
    pytest.importorskip("llama_index.retrievers.bm25")
    module = load("llamaindex_rag")
    return module, module.main()


def test_llamaindex_rag_pipeline_runs(rag):
    module, answers = rag
    assert set(answers) == set(module.QUESTIONS) | {"chat: Where does Velmora live?"}
    assert all(isinstance(a, str) and a for a in answers.values()), answers
    retriever = module.build_query_engine().retriever
    for question, expected in module.QUESTIONS.items():      # the passage the model is given holds the answer
        assert expected in retriever.retrieve(question)[0].node.get_content()


def test_llamaindex_rag_answers_from_the_documents(rag):
    module, answers = rag
    assert all(expected.lower() in answers[q].lower() for q, expected in module.QUESTIONS.items()), answers
    assert "tarnhollow" in answers["chat: Where does Velmora live?"].lower()


@pytest.fixture(scope="module")
def function_agent():
    return load("llamaindex_agent").main()


def test_llamaindex_function_agent_calls_the_tool(function_agent):
    calls, answer = function_agent
    assert calls, "the agent never called its tool"
    name, kwargs, output = calls[0]
    assert name == "get_population" and isinstance(kwargs, dict) and output == '{"population": 73500}'
    assert isinstance(answer, str) and answer


def test_llamaindex_function_agent_answers_with_the_result(function_agent):
    calls, answer = function_agent
    assert calls[0][1] == {"city": "Brambleton"} and "73500" in answer


@pytest.fixture(scope="module")
def langchain_state():
    pytest.importorskip("langchain.agents")
    return load("langchain_agent").main("What's the weather in Lisbon?")


def test_langchain_agent_loop_completes(langchain_state):
    messages = langchain_state["messages"]
    assert messages[0].type == "human" and messages[-1].type == "ai" and not messages[-1].tool_calls
    for message in messages:                  # every call the model made went to a real tool and back
        for call in getattr(message, "tool_calls", []):
            assert call["name"] in {"get_weather", "get_stock_price"} and isinstance(call["args"], dict)
    assert sum(m.type == "tool" for m in messages) == sum(len(getattr(m, "tool_calls", [])) for m in messages)


def test_langchain_agent_answers_with_the_tool_result(langchain_state):
    messages = langchain_state["messages"]
    assert [m.type for m in messages[:3]] == ["human", "ai", "tool"]
    assert messages[1].tool_calls[0]["name"] == "get_weather"
    assert messages[1].tool_calls[0]["args"] == {"city": "Lisbon"}
    assert "21" in messages[-1].content


@pytest.fixture(scope="module")
def litellm_out():
    return load("litellm_completion").main()


def test_litellm_completion_stream_and_tools(litellm_out):
    answer = litellm_out["answer"]
    assert "dlm-tiny" in answer.choices[0].message.content        # "Who are you?": in its training data
    assert answer.usage.completion_tokens > 0 and answer.model.endswith("dlm-tiny")
    assert litellm_out["streamed"].strip()
    assert_calls_parse(litellm_out["tool_call"])


def test_litellm_calls_the_right_tool(litellm_out):
    assert_called(litellm_out["tool_call"], "get_time", '"Oslo"')


@WEAK_AT_ARITHMETIC
def test_litellm_streamed_sum_is_right(litellm_out):
    assert litellm_out["streamed"].strip() == "42"


def test_litellm_proxy_config_resolves_the_handler():
    import yaml
    config = yaml.safe_load((ROOT / "litellm_proxy_config.yaml").read_text())
    entry = config["litellm_settings"]["custom_provider_map"][0]
    module, _, attr = entry["custom_handler"].rpartition(".")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    handler = getattr(importlib.import_module(module), attr)
    assert entry["provider"] == "dlm" and hasattr(handler, "acompletion") and hasattr(handler, "astreaming")
    assert config["model_list"][0]["litellm_params"]["model"] == "dlm/dlm-tiny"


@pytest.fixture(scope="module")
def proxy_out():
    pytest.importorskip("backoff", reason="the LiteLLM proxy's dependencies: pip install -e '.[litellm-proxy]'")
    return load("litellm_proxy").main()


def test_litellm_proxy_serves_the_provider(proxy_out):
    assert proxy_out["models"] == ["dlm-tiny"]
    answer = proxy_out["answer"]
    assert "dlm-tiny" in answer.choices[0].message.content and answer.usage.completion_tokens > 0
    assert proxy_out["streamed"].strip()
    assert_calls_parse(proxy_out["tool_call"])


def test_litellm_proxy_answers_a_refused_request_with_400(proxy_out):
    """n=2 reached the proxy as an APIConnectionError and went back as a 500 (clients retried it)."""
    import openai

    refused = proxy_out["refused"]
    assert isinstance(refused, openai.BadRequestError) and refused.status_code == 400 and refused.param == "n"
    assert "n=2 is not supported" in refused.message


def test_litellm_proxy_calls_the_right_tool(proxy_out):
    assert_called(proxy_out["tool_call"], "get_time", '"Oslo"')


@WEAK_AT_ARITHMETIC
def test_litellm_proxy_streamed_sum_is_right(proxy_out):
    assert proxy_out["streamed"].strip() == "42"


@pytest.fixture(scope="module")
def openai_out():
    return load("openai_client").main()


def test_openai_client_against_dlm_serve(openai_out):
    assert openai_out["chat"].choices[0].message.content
    assert openai_out["streamed"].strip()
    assert_calls_parse(openai_out["tool_call"])
    forced = openai_out["forced"].choices[0]             # a named tool_choice always yields a parsed call
    assert forced.finish_reason == "tool_calls"
    assert forced.message.tool_calls[0].function.name == "get_weather"
    assert list(json.loads(forced.message.tool_calls[0].function.arguments)) == ["city"]


def test_openai_client_calls_the_right_tool(openai_out):
    assert_called(openai_out["tool_call"], "get_weather", "Kyoto")


@WEAK_AT_LISTS
def test_openai_client_streamed_sort_is_right(openai_out):
    assert openai_out["streamed"].strip() == "4, 7, 9"
