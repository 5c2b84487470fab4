"""ChatDLM behaviour the standard suites do not pin down, on the tiny test checkpoint."""

import pytest

pytest.importorskip("langchain_core", reason="install the [langchain] extra")

from pydantic import BaseModel, field_validator  # noqa: E402
from pydantic.v1 import BaseModel as BaseModelV1  # noqa: E402

from dlm_backend.adapters.langchain import ChatDLM, ai_message  # noqa: E402


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


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_structured_output_that_misses_the_schema_is_a_parsing_error_not_a_lenient_parse(dream_chat, method):
    """An untrained model writes no JSON in json_mode and cannot meet this pattern: LangChain's lenient
    parser used to return ``{}`` or the object that broke the schema as if it were the answer."""
    from langchain_core.exceptions import OutputParserException

    schema = {"title": "Code", "type": "object", "required": ["code"],
              "properties": {"code": {"type": "string", "pattern": "^zq-[0-9]{12}$"}}}
    model = ChatDLM(model=str(dream_chat), max_tokens=24, block_length=8, kv_cache="dual", sampler="threshold")
    chat = model.with_structured_output(schema if method == "json_schema" else None, method=method, include_raw=True)
    out = chat.invoke("Give me the code.")
    assert out["parsed"] is None and isinstance(out["parsing_error"], OutputParserException)
    assert out["raw"].additional_kwargs == {}
    with pytest.raises(OutputParserException, match="does not match the requested JSON schema"):
        model.with_structured_output(schema, method="json_schema").invoke("Give me the code.")


def test_a_malformed_call_is_an_invalid_tool_call_not_a_silent_empty_message():
    from dlm_backend.chat import ChatResult
    from dlm_backend.engine.outputs import GenerationOutput
    from dlm_backend.chat.tool_calls import parse_tool_calls

    text = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    content, calls, bad = parse_tool_calls(text)
    result = ChatResult(content, [], "stop", GenerationOutput("r", [1, 2], [3], text, "stop", 1), invalid_tool_calls=bad)
    msg = ai_message(result, "dlm-tiny")
    assert msg.tool_calls == [] and msg.content == text
    assert [(c["name"], c["args"]) for c in msg.invalid_tool_calls] == [("get_weather", bad[0]["arguments"])]
    assert msg.invalid_tool_calls[0]["error"].startswith("malformed tool call")


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return "sunny"


def test_constructor_loads_no_weights_and_the_profile_comes_from_config(dream_chat):
    from dlm_backend.engine import shared_engines as shared
    before = len(shared.loaded())
    model = ChatDLM(model=str(dream_chat) + "/", max_tokens=16)
    assert len(shared.loaded()) == before
    assert model.profile["max_input_tokens"] == 512 and model.profile["tool_calling"]   # dream-tiny's config.json


def test_tool_choice_none_and_forced_streams(dream_chat):
    model = ChatDLM(model=str(dream_chat), max_tokens=96, block_length=16)
    none = model.bind_tools([get_weather], tool_choice="none").invoke("weather in Oslo?")
    assert none.tool_calls == [] and none.invalid_tool_calls == []
    chunks = list(model.bind_tools([get_weather], tool_choice="get_weather").stream("weather in Oslo?"))
    calls = [c for chunk in chunks for c in chunk.tool_call_chunks]
    # A forced call streams as written: its name once, then argument fragments of the same call.
    assert calls[0]["name"] == "get_weather" and all(c["name"] is None for c in calls[1:])
    assert len({c["index"] for c in calls}) == 1
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.tool_calls[0]["name"] == "get_weather" and set(merged.tool_calls[0]["args"]) == {"city"}


def test_the_response_cache_tells_apart_stop_and_seed(dream_chat):
    """LangChain's cache key is the model's identifying params: a truncated or reseeded answer is another."""
    from langchain_core.caches import InMemoryCache

    keys = {ChatDLM(model=str(dream_chat), **kw)._get_llm_string()
            for kw in ({}, {"stop": ["."]}, {"seed": 1}, {"seed": 2})}
    assert len(keys) == 4
    cache = InMemoryCache()
    plain = ChatDLM(model=str(dream_chat), max_tokens=16, block_length=8, sampler="llada", cache=cache)
    stopped = ChatDLM(model=str(dream_chat), max_tokens=16, block_length=8, sampler="llada", cache=cache, stop=["e"])
    full = plain.invoke("hi").content
    assert "e" not in stopped.invoke("hi").content and plain.invoke("hi").content == full


def test_every_knob_is_a_field_and_a_misspelled_one_is_refused(dream_chat):
    from dlm_backend.engine.params import KNOBS
    from dlm_backend.errors import SamplingParamsError

    fields = set(ChatDLM.model_fields)
    assert {n for n in KNOBS if n != "cache"} | {"kv_cache"} <= fields
    model = ChatDLM(model=str(dream_chat), max_tokens=8, block_length=8, gamma=0.2, sampler="entropy_bounded")
    assert model.invoke("hi").response_metadata["finish_reason"] in ("stop", "length")
    with pytest.raises(SamplingParamsError, match="Did you mean 'threshold'"):
        model.invoke("hi", thresold=0.5)


def test_model_names_are_readable_and_llm_output_carries_usage():
    """ls_model_name and response_metadata["model_name"] were the embedded model's path inside the
    installed package, and LLMResult.llm_output was None: ChatOpenAI fills it with token_usage and
    model_name, and callbacks that read only llm_output (usage trackers) saw nothing."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import HumanMessage

    class Outputs(BaseCallbackHandler):
        seen: list = []

        def on_llm_end(self, response, **kwargs):
            self.seen.append(response.llm_output)

    model = ChatDLM(max_tokens=8, block_length=8)
    assert model._get_ls_params()["ls_model_name"] == "dlm-tiny"
    reply = model.invoke("hi", config={"callbacks": [Outputs()]})
    assert reply.response_metadata["model_name"] == "dlm-tiny"
    [output] = Outputs.seen
    assert output["model_name"] == "dlm-tiny"
    assert output["token_usage"]["prompt_tokens"] == reply.usage_metadata["input_tokens"]
    batch = model.generate([[HumanMessage("hi")], [HumanMessage("hello there")]])    # a batch's usage is summed
    usage = [g[0].message.usage_metadata for g in batch.generations]
    assert batch.llm_output["token_usage"]["total_tokens"] == sum(u["total_tokens"] for u in usage)


def test_a_named_model_keeps_the_name_it_was_given(dream_chat):
    model = ChatDLM(model=str(dream_chat), max_tokens=4, block_length=4)
    assert model._get_ls_params()["ls_model_name"] == str(dream_chat)
    assert model.invoke("hi").response_metadata["model_name"] == str(dream_chat)


@pytest.fixture
def scripted_bob(tmp_path, dream_chat):
    """Models that always answer with Bob: as JSON, and as a call to the tool ``Alice``."""
    from tests import scripted_model
    from tests.scripted_model import write_scripted_checkpoint

    from dlm_backend.plugins import load_plugins

    pm = load_plugins()
    pm.register(scripted_model, name="scripted-model")
    call = '<tool_call>\n{"name": "Alice", "arguments": {"name": "Bob"}}\n</tool_call>'
    try:
        yield {kind: str(write_scripted_checkpoint(tmp_path / kind, dream_chat, text, "<|im_start|>assistant\n"))
               for kind, text in (("json", '{"name": "Bob"}'), ("call", call))}
    finally:
        pm.unregister(name="scripted-model")


class Alice(BaseModel):
    """A schema whose check goes past JSON schema: only Alice validates."""
    name: str

    @field_validator("name")
    @classmethod
    def _only_alice(cls, name: str) -> str:
        if name != "Alice":
            raise ValueError("not Alice")
        return name


@pytest.mark.parametrize("method", ["json_mode", "json_schema", "function_calling"])
def test_structured_output_that_does_not_validate_is_an_output_parser_exception(scripted_bob, method):
    """json_mode parsed the reply's JSON and raised pydantic's ValidationError where ChatOpenAI raises
    OutputParserException; with include_raw=True the miss is ``parsing_error``, as ChatOpenAI's is."""
    from langchain_core.exceptions import OutputParserException

    folder = scripted_bob["call" if method == "function_calling" else "json"]
    model = ChatDLM(model=folder, max_tokens=96, kv_cache="none", sampler="llada")
    with pytest.raises(OutputParserException, match="not Alice"):
        model.with_structured_output(Alice, method=method).invoke("Who?")
    out = model.with_structured_output(Alice, method=method, include_raw=True).invoke("Who?")
    assert out["parsed"] is None and isinstance(out["parsing_error"], OutputParserException)
    assert "Bob" in str(out["raw"].content) + str(out["raw"].tool_calls)


def test_bind_tools_takes_strict_and_logprobs_false_passes(dream_chat):
    """ChatOpenAI's bind_tools(strict=True) was refused ("Unknown ChatDLM call field 'strict'"), and
    logprobs=False (asking for none) too, which the server and LiteLLM accept."""
    from dlm_backend.errors import DLMError

    model = ChatDLM(model=str(dream_chat), max_tokens=96, block_length=32, logprobs=False)
    reply = model.bind_tools([get_weather], tool_choice="get_weather", strict=True).invoke("Weather in Paris?")
    assert [c["name"] for c in reply.tool_calls] == ["get_weather"]
    assert model.invoke("hi", logprobs=False, max_tokens=8).content is not None
    assert model.invoke("hi", logprobs=None, max_tokens=8).content is not None
    with pytest.raises(DLMError, match="n=2 is not supported"):       # and a field asking for more is named
        model.invoke("hi", n=2, max_tokens=8)
