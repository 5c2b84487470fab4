"""A LangChain agent on the embedded diffusion model: it calls a tool and answers from the result."""

from langchain.agents import create_agent
from langchain_core.tools import tool

from dlm_backend.adapters.langchain import ChatDLM


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city"""
    return '{"temperature": 21, "sky": "sunny"}'


@tool
def get_stock_price(symbol: str) -> str:
    """Get the latest price of a stock"""
    return '{"price": 123.45}'


def main(question: str = "What's the weather in Lisbon?") -> dict:
    model = ChatDLM(max_tokens=64)
    agent = create_agent(model, tools=[get_weather, get_stock_price])
    state = agent.invoke({"messages": [{"role": "user", "content": question}]})
    for message in state["messages"]:
        print(f"{message.type}: {message.content or message.tool_calls}")
    return state


if __name__ == "__main__":
    main()
