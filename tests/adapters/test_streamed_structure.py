"""Structured output streamed as it is written: every front door yields real, growing partial
objects that end at the whole answer (LlamaIndex's stream_structured_predict yielded empty ones).
A scripted model (tests/scripted_model.py) writes a known answer through the engine's real loop."""

import json

import pytest
from tests import scripted_model
from tests.scripted_model import write_scripted_checkpoint

from dlm_backend.plugins import load_plugins

PERSON = {"name": "Bob Marley", "age": 36, "city": "Kingston"}
CALL = '<tool_call>\n{"name": "Person", "arguments": ' + json.dumps(PERSON) + "}\n</tool_call>"
MARKER = "<|im_start|>assistant\n"


@pytest.fixture
def scripted(tmp_path, dream_chat):
    pm = load_plugins()
    pm.register(scripted_model, name="scripted-model")
    try:
        yield str(write_scripted_checkpoint(tmp_path / "person", dream_chat, CALL, MARKER))
    finally:
        pm.unregister(name="scripted-model")


def _person_cls():
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        city: str
    return Person


def _grows(partials: list[dict]) -> None:
    """Each partial keeps the previous one's settled fields and the last is the whole answer."""
    filled = [{k: v for k, v in p.items() if v not in (None, "")} for p in partials]
    assert filled[-1] == PERSON and len({len(f) for f in filled}) >= 3          # they grow, value by value
    for before, after in zip(filled, filled[1:]):
        assert all(after.get(k) == v for k, v in before.items() if k != list(before)[-1])


def test_llamaindex_stream_structured_predict_yields_growing_objects(scripted):
    pytest.importorskip("llama_index.core")
    from llama_index.core.prompts import PromptTemplate

    from dlm_backend.adapters.llamaindex import DLM

    llm = DLM(model=scripted, max_tokens=160, kv_cache="none", sampler="llada")
    Person = _person_cls()
    prompt = PromptTemplate("Who is {who}?")
    partials = [p.model_dump() for p in llm.stream_structured_predict(Person, prompt, who="Bob")]
    _grows(partials)
    assert llm.structured_predict(Person, prompt, who="Bob").model_dump() == partials[-1]
    final = list(llm.as_structured_llm(Person).stream_chat([__import__(
        "llama_index.core.base.llms.types", fromlist=["ChatMessage"]).ChatMessage(role="user", content="Bob?")]))[-1]
    assert json.loads(final.message.content) == PERSON


def test_langchain_function_calling_stream_yields_growing_dicts(scripted):
    pytest.importorskip("langchain_core")
    from dlm_backend.adapters.langchain import ChatDLM

    chat = ChatDLM(model=scripted, max_tokens=160, kv_cache="none", sampler="llada")
    structured = chat.with_structured_output(_person_cls(), method="function_calling")
    chunks = list(chat.bind_tools([_person_cls()], tool_choice="Person").stream("Bob?"))
    assert chunks[0].tool_call_chunks[0]["name"] == "Person" and len(chunks) > 4
    assert all(c.tool_call_chunks[0]["name"] is None for c in chunks[1:] if c.tool_call_chunks)
    whole = chunks[0]
    for c in chunks[1:]:
        whole = whole + c
    assert whole.tool_calls[0]["args"] == PERSON
    assert structured.invoke("Bob?").model_dump() == PERSON


def test_the_server_streams_a_forced_call_in_openai_chunks(scripted):
    openai = pytest.importorskip("openai")
    from tests.helpers import serve_in_thread

    from dlm_backend.server import create_app

    tool = {"type": "function", "function": {"name": "Person", "parameters": _person_cls().model_json_schema()}}
    with serve_in_thread(create_app(scripted, served_name="s")) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x")
        stream = client.chat.completions.create(model="s", messages=[{"role": "user", "content": "Bob?"}], tools=[tool],
                                                tool_choice={"type": "function", "function": {"name": "Person"}},
                                                max_tokens=160, stream=True, extra_body={"kv_cache": "none", "sampler": "llada"})
        calls = [c.choices[0].delta.tool_calls[0] for c in stream if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0].id and calls[0].function.name == "Person" and len(calls) > 3
    assert all(c.id is None and c.function.name is None for c in calls[1:])
    assert json.loads("".join(c.function.arguments for c in calls)) == PERSON
