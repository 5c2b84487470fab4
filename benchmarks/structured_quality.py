"""Structured output against free generation, on the embedded model's held-out JSON and tool-call prompts.

For each held-out JSON prompt (the recipe's own generator, its eval split: recipes/dlm_tiny), the
answer is asked twice: freely (the text parsed as JSON) and with the schema as a ``response_format``
(the chat layer's structured output). For each held-out tool-call prompt that expects a call, the call
is asked freely (parsed out of the text) and forced (``tool_choice`` naming the expected tool). Exact
means the object, or the call's arguments, equal the expected ones; valid means it parses and has
the schema's keys and types. Same checkpoint, same decoding knobs, one run.

    python benchmarks/structured_quality.py                 # dlm-tiny, 20 prompts a family
    python benchmarks/structured_quality.py MODEL --per-family 50
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm_backend import LLM, chat  # noqa: E402


def held_out(per_family: int):
    from dlm_tiny import evaluate            # the recipe's generator: pip install -e recipes/dlm_tiny

    examples = evaluate.held_out(per_family * 4)
    json_cases = [e for e in examples if e.family == "json"][:per_family]
    calls = [e for e in examples if e.family == "tool_call" and "name" in e.expected][:per_family]
    return json_cases, calls


def _typed(obj, schema) -> bool:
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    props = schema["properties"]
    return isinstance(obj, dict) and set(obj) == set(props) and all(
        isinstance(obj[k], types[p["type"]]) and (p["type"] == "boolean" or not isinstance(obj[k], bool))
        for k, p in props.items())


def json_rows(llm, cases, params):
    rows = {"free": [0, 0, 0, 0.0], "response_format": [0, 0, 0, 0.0]}     # exact, valid, passes, seconds
    for e in cases:
        want, schema = e.expected["object"], e.expected["schema"]
        start = time.perf_counter()
        answer = chat.complete(llm, chat.ChatRequest(messages=e.messages, params=params))
        rows["free"][2:] = [rows["free"][2] + answer.num_forward_passes, rows["free"][3] + time.perf_counter() - start]
        free = answer.content
        try:
            got = json.loads(free)
        except ValueError:
            got = None
        rows["free"][0] += got == want and _typed(got, schema)
        rows["free"][1] += _typed(got, schema)
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        start = time.perf_counter()
        result = chat.complete(llm, chat.ChatRequest(messages=e.messages, params=params, response_format=fmt))
        row = rows["response_format"]
        row[2:] = [row[2] + result.num_forward_passes, row[3] + time.perf_counter() - start]
        got = json.loads(result.content) if result.parsed is not None else None
        rows["response_format"][0] += got == want and _typed(got, schema)
        rows["response_format"][1] += result.parsed is not None and _typed(result.parsed, schema)
    return rows


def call_rows(llm, cases, params):
    rows = {"free": [0, 0, 0, 0.0], "forced": [0, 0, 0, 0.0]}
    for e in cases:
        want = e.expected
        for label, choice in (("free", None), ("forced", {"type": "function", "function": {"name": want["name"]}})):
            start = time.perf_counter()
            result = chat.complete(llm, chat.ChatRequest(messages=e.messages, tools=e.tools, params=params,
                                                         tool_choice=choice))
            rows[label][2:] = [rows[label][2] + result.num_forward_passes,
                               rows[label][3] + time.perf_counter() - start]
            calls = result.tool_calls
            args = json.loads(calls[0]["function"]["arguments"]) if calls else None
            rows[label][0] += bool(calls) and calls[0]["function"]["name"] == want["name"] and args == want["arguments"]
            rows[label][1] += bool(calls) and calls[0]["function"]["name"] == want["name"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--per-family", type=int, default=20)
    a = ap.parse_args()
    json_cases, call_cases = held_out(a.per_family)
    with LLM(a.model) as llm:
        params = llm.sampling_params(max_tokens=96)
        start = time.perf_counter()
        jr = json_rows(llm, json_cases, params)
        cr = call_rows(llm, call_cases, params)
        wall = time.perf_counter() - start
    print(f"model: {a.model or 'dlm-tiny'}; its decoding defaults ({params.sampler}, block {params.block_length}, "
          f"cache {params.cache}); {wall:.0f} s\n")
    n = len(json_cases)
    print(f"| held-out JSON prompts (n={n}) | exact | valid | passes / answer | s / answer |\n|---|---|---|---|---|")
    for label, (exact, valid, passes, secs) in jr.items():
        print(f"| {label} | {exact}/{n} | {valid}/{n} | {passes / n:.1f} | {secs / n:.2f} |")
    n = len(call_cases)
    print(f"\n| held-out tool calls (n={n}) | name + arguments exact | right tool | passes / answer | s / answer |"
          "\n|---|---|---|---|---|")
    for label, (exact, named, passes, secs) in cr.items():
        print(f"| {label} | {exact}/{n} | {named}/{n} | {passes / n:.1f} | {secs / n:.2f} |")


if __name__ == "__main__":
    main()
