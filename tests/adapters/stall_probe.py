"""The worst event-loop stall of each front door's first async call, measured with a ticking coroutine.

Run as ``python stall_probe.py DOOR MODEL_FOLDER`` (tests/adapters/test_async_first_use.py runs each
door in a fresh process, as a program whose first request goes through it). The framework first
answers with its own fake model, so its own first-call costs (lazy imports, LiteLLM's tiktoken)
are paid before measuring: what is left is the adapter's, the model's load included. Prints the
worst stall in ms.
"""

import asyncio
import os
import sys
import time

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


async def first_call(door: str, model: str) -> None:
    if door.startswith("langchain"):
        from dlm_backend.adapters.langchain import ChatDLM
        chat = ChatDLM(model=model, **KNOBS)
        if door == "langchain_ainvoke":
            await chat.ainvoke("hi")
        else:
            async for _ in chat.astream("hi"):
                pass
    elif door == "litellm_acompletion":
        import litellm
        import dlm_backend.adapters.litellm  # noqa: F401
        await litellm.acompletion(model=f"dlm/{model}", messages=[{"role": "user", "content": "hi"}], **KNOBS)
    else:
        from llama_index.core import Document, Settings, VectorStoreIndex
        from llama_index.core.chat_engine import SimpleChatEngine
        from llama_index.core.embeddings import MockEmbedding
        from llama_index.core.llms import ChatMessage

        from dlm_backend.adapters.llamaindex import DLM
        llm = DLM(model=model, **KNOBS)
        Settings.tokenizer = llm.tokenizer                  # the documented line
        if door == "llamaindex_achat":
            await llm.achat([ChatMessage(role="user", content="hi")])
        elif door == "llamaindex_aquery":
            docs = [Document(text="dlm-tiny is a small diffusion language model. " * 30)]
            index = VectorStoreIndex.from_documents(docs, embed_model=MockEmbedding(embed_dim=8))
            await index.as_query_engine(llm=llm).aquery("What is dlm-tiny?")
        elif door == "llamaindex_chat_engine":
            await SimpleChatEngine.from_defaults(llm=llm).achat("hi")
        else:
            from llama_index.core.agent.workflow import FunctionAgent

            def add(a: int, b: int) -> int:
                """Add two numbers."""
                return a + b
            agent = FunctionAgent(tools=[add], llm=DLM(model=model, max_tokens=64, block_length=16))
            await agent.run("What is 2 + 3?")


async def worst_stall(call) -> float:
    gaps, done = [], asyncio.Event()

    async def tick():
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            gaps.append(now - last - TICK)
            last = now
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
