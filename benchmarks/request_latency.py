"""One request at a time through the front doors' parameters: latency and passes per decoding config.

Chat, grounded-QA, tool-call and JSON prompts go one by one (no batching) through
``chat.request_params`` exactly as the adapters and the server build them (the 256-token default
canvas), once per config: the checkpoint's own defaults, the same with the dual cache, ``threshold``
0.9 at blocks of 32, and ``llada`` one token per pass as the reference. Prints one table.

    .venv/bin/python benchmarks/request_latency.py [MODEL] [--repeats 3]
"""

import argparse
import time

from dlm_backend import LLM
from dlm_backend.chat import request_params

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
PROMPTS = [
    ([{"role": "user", "content": "Who are you?"}], None),
    ([{"role": "user", "content": "Say hello to Mira."}], None),
    ([{"role": "user", "content": "Context:\nAda lives in Oslo. Ada works as a nurse.\n\nQuestion: What is Ada's job?"}],
     None),
    ([{"role": "user", "content": "Context:\nBo plays chess. Bo lives in Lima.\n\nQuestion: Where does Bo live?"}],
     None),
    ([{"role": "user", "content": "What is the weather in Oslo?"}], [WEATHER]),
    ([{"role": "user", "content": "Is it raining in Kyoto right now?"}], [WEATHER]),
    ([{"role": "user", "content": "Extract the person as JSON with keys name and city: Bo lives in Rome."}], None),
    ([{"role": "user", "content": "Return JSON with a key color for: the car is red."}], None),
]
CONFIGS = {
    "checkpoint defaults": {},
    "checkpoint defaults, dual cache": {"kv_cache": "dual"},
    "threshold 0.9, block 32, dual": {"threshold": 0.9, "block_length": 32, "kv_cache": "dual"},
    "llada 1 tok/step, block 32, dual": {"sampler": "llada", "block_length": 32, "kv_cache": "dual"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.model)
    prompts = [llm.encode_chat(messages, tools=tools) for messages, tools in PROMPTS] * args.repeats
    llm.generate(prompt_token_ids=prompts[:1])                     # warm-up
    print(f"model: {llm.config.model}; defaults {llm.engine.sampling_defaults or 'none'}; "
          f"{len(prompts)} requests one at a time")
    print("| config | ms/request | passes/request |\n|---|---:|---:|")
    for label, knobs in CONFIGS.items():
        params = request_params(llm, knobs, taken=("cache",))
        start, passes = time.perf_counter(), 0
        for ids in prompts:
            passes += llm.generate(prompt_token_ids=[ids], sampling_params=params)[0].num_forward_passes
        ms = 1000 * (time.perf_counter() - start) / len(prompts)
        print(f"| {label} | {ms:.0f} | {passes / len(prompts):.1f} |")


if __name__ == "__main__":
    main()
