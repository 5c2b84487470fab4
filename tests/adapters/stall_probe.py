"""The worst event-loop stall of each front door's first async call, measured with a ticking coroutine.

Run as ``python stall_probe.py DOOR MODEL_FOLDER`` (tests/adapters/test_async_first_use.py runs each
door in a fresh process, as a program whose first request goes through it). The framework first
answers with its own fake model, so its own first-call costs (lazy imports, LiteLLM's tiktoken)
are paid before measuring: what is left is the adapter's, the model's load included. Prints the
worst stall in ms, less the time the garbage collector ran inside it: a full collection of this
process's heap (torch and a framework) takes 40-160 ms here and runs in whichever thread allocates,
so it is the interpreter's pause, not work the door put on the loop.
"""

import asyncio
import gc
import os
import sys
import time
from typing import Awaitable

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
TICK = 0.005
KNOBS = {"max_tokens": 8, "block_length": 8}


async def warm_framework(door: str) -> None:
    """The framework's own first call, with its own fake model."""
    if door.startswith("langchain"):
        from langchain_core.language_models.fake_chat_models import FakeListChatModel

        import dlm_backend.adapters.langchain  # noqa: F401
        await FakeListChatModel(responses=["x"]).ainvoke("hi")
        async for _ in FakeListChatModel(responses=["x"]).astream("hi"):
            pass
    elif door.startswith("litellm"):
        import litellm

        import dlm_backend.adapters.litellm  # noqa: F401
        await litellm.acompletion(model="openai/gpt-4o", messages=[{"role": "user", "content": "hi"}], mock_response="x")
    else:
        from llama_index.core import Document, VectorStoreIndex
        from llama_index.core.chat_engine import SimpleChatEngine
        from llama_index.core.embeddings import MockEmbedding
        from llama_index.core.llms import ChatMessage, MockLLM

        import dlm_backend.adapters.llamaindex  # noqa: F401
        await MockLLM().achat([ChatMessage(role="user", content="hi")])
        index = VectorStoreIndex.from_documents([Document(text="x y z")], embed_model=MockEmbedding(embed_dim=8))
        await index.as_query_engine(llm=MockLLM()).aquery("x")
        await SimpleChatEngine.from_defaults(llm=MockLLM()).achat("hi")


def first_call(door: str, model: str) -> Awaitable:
    """The door's first async call, not started yet. The objects an application builds at start-up
    (the chat model, the index, the agent and its tool schemas: pydantic builds those in 80 ms) are
    built here, before the measuring starts; loading the model is left to the call."""
    if door.startswith("langchain"):
        from dlm_backend.adapters.langchain import ChatDLM
        chat = ChatDLM(model=model, **KNOBS)
        if door == "langchain_ainvoke":
            return chat.ainvoke("hi")

        async def consume():
            async for _ in chat.astream("hi"):
                pass
        return consume()
    if door == "litellm_acompletion":
        import litellm
        import dlm_backend.adapters.litellm  # noqa: F401
        return litellm.acompletion(model=f"dlm/{model}", messages=[{"role": "user", "content": "hi"}], **KNOBS)
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import ChatMessage

    from dlm_backend.adapters.llamaindex import DLM
    llm = DLM(model=model, **KNOBS)
    Settings.tokenizer = llm.tokenizer                  # the documented line
    if door == "llamaindex_achat":
        return llm.achat([ChatMessage(role="user", content="hi")])
    if door == "llamaindex_aquery":
        docs = [Document(text="dlm-tiny is a small diffusion language model. " * 30)]
        index = VectorStoreIndex.from_documents(docs, embed_model=MockEmbedding(embed_dim=8))
        return index.as_query_engine(llm=llm).aquery("What is dlm-tiny?")
    if door == "llamaindex_chat_engine":
        return SimpleChatEngine.from_defaults(llm=llm).achat("hi")
    from llama_index.core.agent.workflow import FunctionAgent

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b
    agent = FunctionAgent(tools=[add], llm=DLM(model=model, max_tokens=64, block_length=16))

    async def run():
        return await agent.run("What is 2 + 3?")        # the workflow starts when awaited, not built
    return run()


class CollectorClock:
    """Seconds the garbage collector has run in this process (any thread) since it was made."""

    def __init__(self):
        self.seconds, self._start = 0.0, 0.0
        gc.callbacks.append(self._on_collect)

    def _on_collect(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


async def worst_stall(call) -> float:
    gaps, done, collector = [], asyncio.Event(), CollectorClock()

    async def tick():
        last, collected = time.perf_counter(), collector.seconds
        while not done.is_set():
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            gaps.append(now - last - TICK - (collector.seconds - collected))
            last, collected = now, collector.seconds
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    await call
    done.set()
    await ticker
    return max(gaps) * 1000


async def main(door: str, model: str) -> float:
    await warm_framework(door)
    return await worst_stall(first_call(door, model))


if __name__ == "__main__":
    print(round(asyncio.run(main(sys.argv[1], sys.argv[2])), 1))
