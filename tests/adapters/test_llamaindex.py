"""The LlamaIndex adapter's mechanics (chat, stream, async, tools, metadata) on a tiny checkpoint."""

import asyncio

import pytest

pytest.importorskip("llama_index.core", reason="install the [llamaindex] extra")

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole, TextBlock, ToolCallBlock  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402

from dlm_backend.adapters.llamaindex import DLM  # noqa: E402


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return f"sunny in {city}"


def test_construction_does_not_load(dream_chat):
    from dlm_backend.engine import shared_engines as shared
    before = len(shared.loaded())
    DLM(model=str(dream_chat) + "/", max_tokens=16)
    assert len(shared.loaded()) == before


def test_chat_complete_stream_and_async(dream_chat):
    llm = DLM(model=str(dream_chat), max_tokens=16, block_length=8)
    meta = llm.metadata
    assert meta.is_function_calling_model and meta.is_chat_model and meta.context_window == 512 and meta.num_output == 16
    r = llm.chat([ChatMessage(role=MessageRole.USER, content="hi")])
    assert isinstance(r.message.content, str) and r.raw["usage"]["completion_tokens"] > 0
    c = llm.complete("hi")
    assert c.text == r.message.content
    streamed = list(llm.stream_chat([ChatMessage(role=MessageRole.USER, content="hi")]))
    assert streamed[-1].message.content == r.message.content
    assert "".join(s.delta or "" for s in streamed) == r.message.content
    a = asyncio.run(llm.achat([ChatMessage(role=MessageRole.USER, content="hi")]))
    assert a.message.content == r.message.content

    async def collect():
        return [x async for x in await llm.astream_complete("hi")]
    assert asyncio.run(collect())[-1].text == r.message.content


def test_tool_plumbing(dream_chat):
    llm = DLM(model=str(dream_chat), max_tokens=96, block_length=16)
    tool = FunctionTool.from_defaults(fn=get_weather)
    prepared = llm._prepare_chat_with_tools([tool], user_msg="weather in Paris?", tool_required=True)
    assert prepared["tool_choice"] == "required" and prepared["tools"][0]["function"]["name"] == "get_weather"
    response = llm.chat_with_tools([tool], user_msg="weather in Paris?", tool_choice="get_weather")
    assert isinstance(response, ChatResponse)
    [call] = llm.get_tool_calls_from_response(response)           # a forced call always parses
    assert call.tool_name == "get_weather" and set(call.tool_kwargs) == {"city"}
    fake = ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, blocks=[
        TextBlock(text=""), ToolCallBlock(tool_call_id="c1", tool_name="get_weather", tool_kwargs={"city": "Paris"})]))
    calls = llm.get_tool_calls_from_response(fake)
    assert calls[0].tool_name == "get_weather" and calls[0].tool_kwargs == {"city": "Paris"}
    with pytest.raises(ValueError):
        llm.get_tool_calls_from_response(ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content="x")))
    assert llm.get_tool_calls_from_response(
        ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content="x")), error_on_no_tool_call=False) == []


def test_structured_predict_returns_the_model_class(dream_chat):
    from llama_index.core.prompts import PromptTemplate
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    llm = DLM(model=str(dream_chat), max_tokens=128, block_length=16)
    person = llm.structured_predict(Person, PromptTemplate("Extract the person: {text}"), text="Bob is 3.")
    assert isinstance(person, Person)                         # a forced call's skeleton: always this shape
    assert isinstance(asyncio.run(llm.astructured_predict(Person, PromptTemplate("{text}"), text="Ann, 40")), Person)


def test_streamed_tool_calls_reach_llamaindex_streaming_structured_output(dream_chat):
    """stream_structured_predict reads each streamed response with process_streaming_objects, which
    looks for calls in additional_kwargs["tool_calls"] only; without them every field came back None."""
    from llama_index.core.program.function_program import get_function_tool
    from llama_index.core.program.utils import process_streaming_objects
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    llm = DLM(model=str(dream_chat), max_tokens=128, block_length=16)
    tool = get_function_tool(Person)
    *_, last = llm.stream_chat_with_tools([tool], user_msg="Bob is 3.", tool_choice="Person")
    person = process_streaming_objects(last, Person, llm=llm)
    assert isinstance(person.name, str) and isinstance(person.age, int)   # the forced call's skeleton


def test_a_reply_sent_back_carries_each_call_once(dream_chat):
    from dlm_backend.adapters.llamaindex import to_openai

    llm = DLM(model=str(dream_chat), max_tokens=96, block_length=16)
    tool = FunctionTool.from_defaults(fn=get_weather)
    reply = llm.chat_with_tools([tool], user_msg="weather in Paris?", tool_choice="get_weather").message
    assert reply.additional_kwargs["tool_calls"] and len(to_openai(reply)["tool_calls"]) == 1


@pytest.fixture
def no_global_tokenizer():
    import llama_index.core
    saved, llama_index.core.global_tokenizer = llama_index.core.global_tokenizer, None
    yield
    llama_index.core.global_tokenizer = saved


def test_a_default_query_engine_over_a_long_document_fits_the_window(no_global_tokenizer):
    """The README through a default VectorStoreIndex: with tiktoken's counts the packed prompt was
    2.3x dlm-tiny's 2048-token window (ContextLengthError); counting with the model's own tokenizer
    (the documented ``Settings.tokenizer = llm.tokenizer``) it fits."""
    from pathlib import Path
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    llm = DLM(max_tokens=32)
    Settings.tokenizer = llm.tokenizer
    index = VectorStoreIndex.from_documents([Document(text=readme)], embed_model=MockEmbedding(embed_dim=8))
    answer = index.as_query_engine(llm=llm).query("What is dlm-tiny?")
    assert isinstance(answer.response, str) and answer.source_nodes


@pytest.fixture
def fresh_settings():
    """LlamaIndex's globals as a new program finds them, restored afterwards."""
    import llama_index.core
    from llama_index.core import Settings

    names = ("_llm", "_embed_model", "_node_parser", "_prompt_helper", "_chat_prompt_helper", "_transformations")
    saved = {n: getattr(Settings, n) for n in names}, llama_index.core.global_tokenizer
    for n in names:
        setattr(Settings, n, None)
    llama_index.core.global_tokenizer = None
    yield Settings
    for n, value in saved[0].items():
        setattr(Settings, n, value)
    llama_index.core.global_tokenizer = saved[1]


@pytest.mark.parametrize("counts_with_the_model", [True, False])
def test_chunk_size_set_before_the_llm(fresh_settings, counts_with_the_model):
    """Settings.chunk_size before Settings.llm builds the splitter with tiktoken, and LlamaIndex reads
    token counts from that global only (no LLM hook): a long-document query packed 2,737 + 256 tokens
    into a 2,048 window. With the documented line it fits; without it the error says what to do."""
    from pathlib import Path
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding

    from dlm_backend.errors import ContextLengthError

    Settings = fresh_settings
    Settings.chunk_size = 1024
    llm = DLM(max_tokens=32)
    Settings.llm = llm
    if counts_with_the_model:
        Settings.tokenizer = llm.tokenizer
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    index = VectorStoreIndex.from_documents([Document(text=readme)], embed_model=MockEmbedding(embed_dim=8))
    if counts_with_the_model:
        assert index.as_query_engine().query("What is dlm-tiny?").source_nodes
    else:
        with pytest.raises(ContextLengthError, match=r"Settings.tokenizer = llm.tokenizer"):
            index.as_query_engine().query("What is dlm-tiny?")


def test_metadata_names_the_model_readably():
    assert DLM().metadata.model_name == "dlm-tiny"           # was the path inside the installed package


def test_every_knob_is_a_field(dream_chat):
    from dlm_backend.engine.params import KNOBS

    assert {n for n in KNOBS if n != "cache"} | {"kv_cache"} <= set(DLM.model_fields)
    llm = DLM(model=str(dream_chat), max_tokens=8, block_length=8, remasking="random", sampler="llada")
    assert isinstance(llm.complete("hi").text, str)


def test_logprobs_false_is_accepted(dream_chat):
    """logprobs=False asks for nothing: the server and LiteLLM took it, DLM refused it as unknown."""
    from dlm_backend.errors import DLMError

    llm = DLM(model=str(dream_chat), max_tokens=8, block_length=8, logprobs=False)
    assert isinstance(llm.chat([ChatMessage(role="user", content="hi")], logprobs=False).message.content, str)
    with pytest.raises(DLMError, match="n=2 is not supported"):       # a field asking for more is named
        llm.chat([ChatMessage(role="user", content="hi")], n=2)
