"""One request at a time through the adapters' parameters: latency and passes per decoding config.

Held-out chat, QA, tool-call and JSON prompts go one by one (no batching) through
``sampling_params`` exactly as the adapters and the server build them (256-token canvas), once per
config: the checkpoint's own defaults, the serving defaults without them, and ``llada`` one token
per pass as the reference. The wall time is the issue's "well under a second per request on 2 CPU
cores".

Measured in session 9 on dlm-tiny (40 prompts, 2 cores): its defaults (threshold 0.95, block 4,
prefix) 188 ms and 7.4 passes a request; the same with the dual cache 147 ms; threshold 0.9 at
block 32, dual 48 ms and 3.4 passes; llada 231 ms and 33.4 passes.

    .venv/bin/python benchmarks/request_latency.py [MODEL] [--per-family 10]
"""

import argparse
import time

from dlm_backend.adapters.common import sampling_params
from dlm_backend.llm import LLM
from dlm_backend.training.evaluate import held_out

CONFIGS = {
    "checkpoint defaults": {},
    "checkpoint defaults, dual cache": {"kv_cache": "dual"},
    "threshold 0.9, block 32, dual": {"threshold": 0.9, "block_length": 32, "kv_cache": "dual"},
    "llada 1 tok/step, block 32, dual": {"sampler": "llada", "block_length": 32, "kv_cache": "dual"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--per-family", type=int, default=10)
    args = parser.parse_args()
    llm = LLM(args.model)
    examples = [e for e in held_out(args.per_family) if e.family in ("chat", "qa", "tool_call", "json")]
    prompts = [llm.encode_chat(e.messages, tools=e.tools) for e in examples]
    llm.generate(prompt_token_ids=prompts[:1])                     # warm-up
    print(f"checkpoint defaults: {llm.engine.sampling_defaults or 'none'}; {len(prompts)} prompts, one at a time")
    print("| config | ms/request | passes/request |\n|---|---|---|")
    for label, knobs in CONFIGS.items():
        params = sampling_params(llm, {}, knobs)
        start, passes = time.perf_counter(), 0
        for ids in prompts:
            passes += llm.generate(prompt_token_ids=[ids], sampling_params=params)[0].num_forward_passes
        ms = 1000 * (time.perf_counter() - start) / len(prompts)
        print(f"| {label} | {ms:.0f} | {passes / len(prompts):.1f} |")


if __name__ == "__main__":
    main()
