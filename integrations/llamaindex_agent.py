"""A LlamaIndex FunctionAgent on the embedded diffusion model: it calls a tool, then answers."""

import asyncio

from llama_index.core import Settings
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool

from dlm_backend.adapters.llamaindex import DLM


def get_population(city: str) -> str:
    """Get the population of a city"""
    return '{"population": 73500}'


async def run(question: str = "How many people live in Brambleton?"):
    llm = DLM(max_tokens=64)
    Settings.tokenizer = llm.tokenizer          # the agent's memory counts in the model's own tokens
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=get_population)], llm=llm)
    handler = agent.run(user_msg=question)
    calls = []
    from llama_index.core.agent.workflow import ToolCallResult
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult):
            calls.append((event.tool_name, event.tool_kwargs, str(event.tool_output)))
    response = await handler
    print("tool calls:", calls)
    print("answer:", response)
    return calls, str(response)


def main():
    return asyncio.run(run())


if __name__ == "__main__":
    main()
