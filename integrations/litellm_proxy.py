"""The LiteLLM proxy serving the dlm provider from litellm_proxy_config.yaml, called with the openai client.

Started as its users start it: `litellm --config integrations/litellm_proxy_config.yaml`, with a
master key (the proxy refuses to run without one) and on loopback.
"""

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).parent))
from litellm_completion import TOOLS  # noqa: E402
from openai_client import free_port  # noqa: E402

CONFIG = Path(__file__).parent / "litellm_proxy_config.yaml"


def main() -> dict:
    port, key = free_port(), "sk-" + secrets.token_hex(16)
    env = {**os.environ, "LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    litellm_cli = Path(sys.executable).with_name("litellm")
    log = tempfile.TemporaryFile("w+")            # a file, not a pipe: a full pipe would stall the proxy
    proxy = subprocess.Popen([str(litellm_cli), "--config", str(CONFIG), "--host", "127.0.0.1", "--port", str(port)],
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
    try:
        deadline, models = time.time() + 300, None      # the proxy's imports alone take ~20 s on 2 cores
        while models is None:
            if proxy.poll() is not None or time.time() > deadline:
                log.seek(0)
                raise RuntimeError("the LiteLLM proxy did not come up:\n" + log.read()[-3000:])
            try:
                models = [m.id for m in client.models.list().data]
            except openai.APIConnectionError:
                time.sleep(0.5)
        print("models:", models)
        answer = client.chat.completions.create(model="dlm-tiny", max_tokens=32,
                                                messages=[{"role": "user", "content": "Who are you?"}])
        print("answer:", answer.choices[0].message.content, answer.usage)
        stream = client.chat.completions.create(model="dlm-tiny", max_tokens=16, stream=True,
                                                messages=[{"role": "user", "content": "What is 12 + 30?"}])
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        print("streamed:", streamed)
        call = client.chat.completions.create(model="dlm-tiny", tools=TOOLS, max_tokens=64,
                                              messages=[{"role": "user", "content": "What time is it in Oslo?"}])
        print("tool calls:", call.choices[0].message.tool_calls)
        try:                                      # a request the model cannot serve is the client's error
            client.chat.completions.create(model="dlm-tiny", n=2, max_tokens=8,
                                           messages=[{"role": "user", "content": "Two answers, please."}])
            refused = None
        except openai.APIStatusError as exc:
            refused = exc
        print("n=2:", refused)
        return {"models": models, "answer": answer, "streamed": streamed, "tool_call": call, "refused": refused}
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    main()
