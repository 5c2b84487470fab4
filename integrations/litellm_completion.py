"""LiteLLM with the dlm provider: plain, streaming and tool-calling completions, no network."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")   # skip the remote cost-map fetch

import litellm  # noqa: E402

import dlm_backend.adapters.litellm  # noqa: E402,F401  (registers "dlm/..." model strings)

TOOLS = [{"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def main() -> dict:
    reply = litellm.completion(model="dlm/dlm-tiny", messages=[{"role": "user", "content": "Who are you?"}],
                               max_tokens=32)
    print("answer:", reply.choices[0].message.content, reply.usage)
    # Diffusion knobs ride along as extra keyword arguments; unset ones take the model's defaults.
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(
        model="dlm/dlm-tiny", messages=[{"role": "user", "content": "What is 12 + 30?"}], max_tokens=16,
        kv_cache="prefix", stream=True))
    print("streamed:", streamed)
    call = litellm.completion(model="dlm/dlm-tiny", messages=[{"role": "user", "content": "What time is it in Oslo?"}],
                              tools=TOOLS, max_tokens=64)
    print("tool calls:", call.choices[0].message.tool_calls)
    return {"answer": reply, "streamed": streamed, "tool_call": call}


if __name__ == "__main__":
    main()
