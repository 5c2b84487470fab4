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
