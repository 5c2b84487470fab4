"""The official openai client against `dlm serve` on loopback."""

import socket
import subprocess
import sys
import time

import openai


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> dict:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "dlm_backend.cli", "serve", "--port", str(port)])
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-needed")
    try:
        for _ in range(300):
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                time.sleep(0.1)
        model = client.models.list().data[0].id
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi!"}],
                                              max_tokens=32)
        print("chat:", chat.choices[0].message.content)
        stream = client.chat.completions.create(model=model, stream=True, max_tokens=16,
                                                messages=[{"role": "user", "content": "Sort these numbers: 9, 4, 7"}])
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        print("streamed:", streamed)
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                  "required": ["city"]}}}]
        call = client.chat.completions.create(model=model, tools=tools, max_tokens=64,
                                              messages=[{"role": "user", "content": "Weather in Kyoto?"}])
        print("tool call:", call.choices[0].message.tool_calls)
        forced = client.chat.completions.create(model=model, tools=tools, max_tokens=64,
                                                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                messages=[{"role": "user", "content": "Weather in Kyoto?"}])
        print("forced tool call:", forced.choices[0].message.tool_calls)
        return {"chat": chat, "streamed": streamed, "tool_call": call, "forced": forced}
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
