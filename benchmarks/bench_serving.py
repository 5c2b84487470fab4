"""Serving throughput: N concurrent requests batched by the engine vs the same N served one at a time.

Both phases run against one ``dlm serve`` process in the same run, so the ratio compares like with
like. Usage::

    .venv/bin/python benchmarks/bench_serving.py [--model PATH] [--requests 32] [--max-tokens 64]

Default model: the embedded dlm-tiny (``$DLM_MODEL`` overrides).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
from loadgen import chat_once, launch  # benchmarks/loadgen.py, beside this script

from dlm_backend.engine.checkpoint.folder import default_model

PROMPTS = [
    "Who are you?", "What is 17 plus 25?", "Sort these numbers: 42, 7, 19, 88, 3",
    "Reverse this list: apple, pear, plum, fig", "Context:\nAda lives in Oslo. Ada works as a nurse.\n\n"
    "Question: What is Ada's job?", "Name 4 colors.", "Count the words: red, blue, green, pink, gray",
    "Extract the person as JSON: Bo is 30 and lives in Rome.",
]


async def run(url: str, n: int, knobs: dict) -> dict:
    prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})") for i in range(n)]
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        await chat_once(client, "warm up", stream=False, **knobs)
        start = time.perf_counter()
        sequential = [await chat_once(client, p, stream=False, **knobs) for p in prompts]
        seq_s = time.perf_counter() - start
        start = time.perf_counter()
        batched = await asyncio.gather(*(chat_once(client, p, stream=False, **knobs) for p in prompts))
        batch_s = time.perf_counter() - start
    for replies in (sequential, batched):
        assert all(r.status == 200 for r in replies), [r.status for r in replies]
    seq_tokens = sum(r.completion_tokens for r in sequential)
    batch_tokens = sum(r.completion_tokens for r in batched)
    same = sum(a.text == b.text for a, b in zip(sequential, batched))
    return {"requests": n, "one_at_a_time_s": seq_s, "one_at_a_time_tok_s": seq_tokens / seq_s,
            "concurrent_s": batch_s, "concurrent_tok_s": batch_tokens / batch_s,
            "ratio": (batch_tokens / batch_s) / (seq_tokens / seq_s), "identical_outputs": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--sampler", default="threshold")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    knobs = {"max_tokens": args.max_tokens, "block_length": 32, "sampler": args.sampler, "kv_cache": "dual"}
    model = args.model or default_model()
    with launch(model, "--max-num-seqs", str(max(64, args.requests))) as url:
        result = asyncio.run(run(url, args.requests, knobs))
    print(f"model: {model}   sampler: {args.sampler}, dual cache, max_tokens {args.max_tokens}\n")
    print("| mode | wall s | tokens/s |\n|---|---:|---:|")
    print(f"| {args.requests} requests one at a time | {result['one_at_a_time_s']:.2f} | "
          f"{result['one_at_a_time_tok_s']:.1f} |")
    print(f"| {args.requests} requests concurrently | {result['concurrent_s']:.2f} | {result['concurrent_tok_s']:.1f} |")
    print(f"\nbatched / one-at-a-time throughput: {result['ratio']:.2f}x; "
          f"identical outputs: {result['identical_outputs']}/{args.requests}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
