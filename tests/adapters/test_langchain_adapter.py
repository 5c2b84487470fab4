"""ChatDLM behaviour the standard suites do not pin down, on the tiny test checkpoint."""

import pytest

pytest.importorskip("langchain_core", reason="install the [langchain] extra")

from pydantic import BaseModel  # noqa: E402
from pydantic.v1 import BaseModel as BaseModelV1  # noqa: E402

from dlm_backend.adapters.langchain import ChatDLM  # noqa: E402


class Joke(BaseModel):
    setup: str
    punchline: str


class JokeV1(BaseModelV1):
    setup: str
    punchline: str


@pytest.mark.parametrize("schema", [Joke, JokeV1])
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_returns_the_schema_class(dream_chat, schema, method):
    """Either pydantic generation, either method: the skeleton makes even an untrained model's answer valid."""
    model = ChatDLM(model=str(dream_chat), max_tokens=128, block_length=32, kv_cache="dual", sampler="threshold")
    chat = model.with_structured_output(schema, method=method)
    assert isinstance(chat.invoke("Tell me a joke."), schema)
    chunks = list(chat.stream("Tell me a joke."))
    assert chunks and isinstance(chunks[-1], schema)


def test_a_malformed_call_is_an_invalid_tool_call_not_a_silent_empty_message():
    from dlm_backend.chat import ChatResult
    from dlm_backend.engine.outputs import GenerationOutput
    from dlm_backend.tool_calls import parse_tool_calls

    text = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    content, calls, bad = parse_tool_calls(text)
    result = ChatResult(content, [], "stop", GenerationOutput("r", [1, 2], [3], text, "stop", 1), invalid_tool_calls=bad)
    msg = ChatDLM._message(result, "dlm-tiny")
    assert msg.tool_calls == [] and msg.content == text
    assert [(c["name"], c["args"]) for c in msg.invalid_tool_calls] == [("get_weather", bad[0]["arguments"])]
    assert msg.invalid_tool_calls[0]["error"].startswith("malformed tool call")
