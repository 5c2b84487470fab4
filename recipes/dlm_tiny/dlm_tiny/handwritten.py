"""The hand-written evaluation set (``eval/handwritten.jsonl``) and its scorer.

The set was written by hand apart from the corpus generator, in the shapes applications send: the
RAG prompts of LlamaIndex and LangChain, tool schemas as the agent frameworks write them, JSON
schemas, short chats. It measures whether dlm-tiny answers prompts it was not shaped for; it must
never be trained on. One JSON object a line: ``id``, ``category``, ``style``, ``messages`` (OpenAI
chat format), ``tools`` (OpenAI function tools, optional) and ``expected``:

* ``qa``, ``tool_result``, ``chat``: ``answers`` (one of them must appear), ``also`` (lists of which
  one each must appear too), ``forbid`` (none may appear: the distractor's value), all compared as
  whole words after :func:`normalize`; ``qa`` with ``refuse`` instead: the answer is not in the
  context and the reply must refuse (:func:`is_refusal`). A QA reply that refuses when the answer is
  there is wrong. A tool result's answer and a chat turn with ``no_call`` must not call a tool.
* ``tool_call``: ``name`` and ``arguments`` (each given argument must be there and equal: strings
  case-insensitive after stripping, numbers numerically, lists in any order), ``alternatives`` (other
  accepted values of an argument), ``contains`` (a string argument must contain this text),
  ``optional`` (may be left out; if given, one of these values). Other arguments may be given only if
  the tool's schema names them. Calls are read as the server reads them (``parse_tool_calls``).
* ``json``: ``object`` (each value compared as a tool argument) and ``alternatives``. The reply is
  parsed as LangChain's and LlamaIndex's parsers do: from a code fence or the outermost braces.
"""

from __future__ import annotations

import json
import math
import re
import time
import unicodedata
from pathlib import Path

from dlm_backend.chat.tool_calls import parse_tool_calls

SET_PATH = Path(__file__).resolve().parents[1] / "eval" / "handwritten.jsonl"
MINIMUM = {"qa": 60, "tool_call": 40, "tool_result": 15, "json": 20, "chat": 15}   # items per category
FRAMEWORK_STYLES = ("llamaindex", "langchain")

# What counts as "the context does not say": each phrase as normalize() writes it.
REFUSALS = ("dont know", "do not know", "not sure", "no information", "not enough information", "unknown",
            "not mentioned", "isnt mentioned", "not mention", "doesnt mention", "does not mention", "no mention",
            "doesnt say", "does not say", "doesnt state", "does not state", "not stated", "not specified",
            "doesnt specify", "does not specify", "not provided", "doesnt provide", "does not provide",
            "not given", "not included", "not available", "doesnt contain", "does not contain", "not in context",
            "not in text", "not in passage", "not in document", "cannot answer", "cant answer",
            "unable to answer", "cannot be determined", "cant be determined", "cannot find", "cant find",
            "could not find", "couldnt find", "dont have", "do not have")


def normalize(text: str) -> str:
    """Lower case, accents and apostrophes dropped, "1,150" as "1150", punctuation as spaces except
    the point or colon inside a number ("3.8", "7:40"), articles dropped, whitespace collapsed."""
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = re.sub(r"['\u2018\u2019`]", "", text)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"(?!(?<=\d)[.:]\d)[^\w\s]|_", " ", text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def has_phrase(text: str, phrase: str) -> bool:
    """``phrase`` in ``text`` as whole words (a plural s allowed); both normalized. "12" is not in "12.5"."""
    phrase = normalize(phrase)
    if not phrase:
        return False
    tail = "s?" if phrase[-1].isalpha() else ""
    return re.search(rf"(?<!\w)(?<!\d[.:]){re.escape(phrase)}{tail}(?!\w)(?![.:]\d)", normalize(text)) is not None


def is_refusal(text: str) -> bool:
    return any(has_phrase(text, p) for p in REFUSALS)


def contains(text: str, exp: dict) -> bool:
    return (any(has_phrase(text, a) for a in exp["answers"])
            and all(any(has_phrase(text, a) for a in group) for group in exp.get("also", []))
            and not any(has_phrase(text, f) for f in exp.get("forbid", [])))


def value_equal(got, want) -> bool:
    """Strings case-insensitive after stripping, numbers numerically (not booleans), lists in any order."""
    if isinstance(want, bool) or want is None:
        return got is want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, abs_tol=1e-9)
    if isinstance(want, str):
        return isinstance(got, str) and " ".join(got.split()).casefold() == " ".join(want.split()).casefold()
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return False
        left = list(got)
        for w in want:
            hit = next((i for i, g in enumerate(left) if value_equal(g, w)), None)
            if hit is None:
                return False
            left.pop(hit)
        return True
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(value_equal(got[k], v) for k, v in want.items())
    return got == want


def _value_ok(got: dict, key: str, exp: dict, values: dict) -> bool:
    if key not in got:
        return False
    wanted = ([values[key]] if key in values else []) + exp.get("alternatives", {}).get(key, [])
    inside = exp.get("contains", {}).get(key)
    return ((not wanted or any(value_equal(got[key], w) for w in wanted))
            and (inside is None or isinstance(got[key], str) and inside.casefold() in got[key].casefold()))


def arguments_ok(got: dict, exp: dict, properties: dict) -> bool:
    required = {*exp["arguments"], *exp.get("alternatives", {}), *exp.get("contains", {})}
    optional = exp.get("optional", {})
    return (all(_value_ok(got, k, exp, exp["arguments"]) for k in required)
            and all(any(value_equal(got[k], v) for v in vs) for k, vs in optional.items() if k in got)
            and set(got) <= set(properties))


def parse_json(text: str):
    """The object as LangChain's and LlamaIndex's JSON parsers find it; None when there is none."""
    text = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    candidates = [fence.group(1)] if fence else []
    candidates += [text, text[text.find("{"):text.rfind("}") + 1]]
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _tool_properties(item: dict, name: str) -> dict:
    tool = next(t for t in item["tools"] if t["function"]["name"] == name)
    return tool["function"].get("parameters", {}).get("properties", {})


def score(item: dict, text: str) -> dict:
    """``correct`` for one reply, plus ``valid`` and ``name`` for tool calls, ``valid`` and
    ``values`` / ``n_values`` (values right, values asked) for JSON."""
    exp, cat = item["expected"], item["category"]
    if cat == "qa":
        refused = is_refusal(text)
        return {"correct": refused if exp.get("refuse") else (not refused and contains(text, exp))}
    if cat == "tool_call":
        _, calls, bad = parse_tool_calls(text)
        valid = bool(calls) and not bad
        name = valid and len(calls) == 1 and calls[0]["name"] == exp["name"]
        return {"valid": valid, "name": name,
                "correct": name and arguments_ok(calls[0]["arguments"], exp, _tool_properties(item, exp["name"]))}
    if cat == "json":
        obj = parse_json(text)
        want = exp["object"]
        hits = 0 if obj is None else sum(_value_ok(obj, k, exp, want) for k in want)
        return {"valid": obj is not None, "values": hits, "n_values": len(want), "correct": hits == len(want)}
    called = "<tool_call>" in text
    if cat == "tool_result" or exp.get("no_call"):
        return {"correct": not called and contains(text, exp)}
    return {"correct": contains(text, exp)}


# -- the set --------------------------------------------------------------------------------------

def check_item(item: dict) -> None:
    """A ValueError naming the item and what is wrong with it."""
    def need(ok, what):
        if not ok:
            raise ValueError(f"{item.get('id', '?')}: {what}")
    need(isinstance(item.get("id"), str) and item.get("category") in MINIMUM, "needs an id and a known category")
    msgs = item.get("messages")
    need(isinstance(msgs, list) and msgs and all(m.get("role") in ("system", "user", "assistant", "tool")
                                                  for m in msgs), "messages must be OpenAI chat messages")
    need(msgs[-1]["role"] in ("user", "tool"), "the last message must be the user's or a tool result")
    tools = item.get("tools", [])
    need(all(t.get("type") == "function" and t["function"].get("name") for t in tools), "malformed tool")
    exp, cat = item.get("expected"), item["category"]
    need(isinstance(exp, dict), "needs an expected spec")
    if cat == "tool_call":
        need(exp.get("name") in {t["function"]["name"] for t in tools}, "expects a tool that is not offered")
        props = _tool_properties(item, exp["name"])
        named = {*exp.get("arguments", {}), *exp.get("alternatives", {}), *exp.get("contains", {}),
                 *exp.get("optional", {})}
        need(isinstance(exp.get("arguments"), dict) and named <= set(props), "arguments the schema lacks")
    elif cat == "json":
        need(isinstance(exp.get("object"), dict) and exp["object"], "needs an expected object")
        need(set(exp.get("alternatives", {})) <= set(exp["object"]), "alternatives for a key not expected")
    elif cat == "qa" and exp.get("refuse"):
        need(exp["refuse"] is True and "answers" not in exp, "a refusal item has no answers")
    else:
        need(isinstance(exp.get("answers"), list) and all(isinstance(a, str) and normalize(a)
                                                          for a in exp["answers"]), "needs answers")
    if cat == "tool_result":
        need(any(m["role"] == "tool" for m in msgs) and any(m.get("tool_calls") for m in msgs),
             "needs an assistant tool call and its result")


def load(path: str | Path | None = None) -> list[dict]:
    items = [json.loads(line) for line in Path(path or SET_PATH).read_text().splitlines() if line.strip()]
    for item in items:
        check_item(item)
    ids = [i["id"] for i in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    return items


def groups(items: list[dict], results: list) -> dict[str, list]:
    """Results by category, the QA subsets (refusals, framework prompts), then ``all``."""
    out: dict[str, list] = {cat: [] for cat in MINIMUM}
    for item, result in zip(items, results):
        out[item["category"]].append(result)
    qa = [(i, r) for i, r in zip(items, results) if i["category"] == "qa"]
    out["qa: not in context"] = [r for i, r in qa if i["expected"].get("refuse")]
    out["qa: framework prompts"] = [r for i, r in qa if i["style"].startswith(FRAMEWORK_STYLES)]
    out["all"] = list(results)
    return {k: v for k, v in out.items() if v}


# -- running it -----------------------------------------------------------------------------------

def configs(llm, max_tokens: int = 128) -> list:
    """The checkpoint's own decoding (its generation_config, as an application gets it) and one token
    a pass for comparison: llada, or for a block-layout checkpoint Fast-dLLM v2's sampler in its blocks."""
    from dlm_backend import SamplingParams
    from dlm_tiny.evaluate import EvalConfig, block_configs

    own = llm.sampling_params(max_tokens=max_tokens)
    block = own.block_length or llm.engine.model_args.block_size
    sub = f", sub-block {own.sub_block_length}" if own.sub_block_length else ""
    label = f"default: {own.sampler} {own.threshold}, {own.cache}, block {block}{sub}"
    if llm.engine.model_args.block_size:
        return [EvalConfig(label, own), block_configs(max_tokens)[0]]
    llada = SamplingParams(max_tokens=max_tokens, block_length=32, sampler="llada", steps=max_tokens, cache="dual")
    return [EvalConfig(label, own), EvalConfig("llada 1 tok/step, dual", llada)]


def evaluate(model: str | None = None, path: str | Path | None = None, max_tokens: int = 128,
             labels: str | None = None, batch_size: int = 16) -> tuple[list[dict], list[dict]]:
    """Rows by (config, group) and every reply with its score."""
    from dlm_backend import LLM
    from dlm_backend.chat.tool_calls import normalize_tools
    from dlm_tiny.evaluate import select_configs

    items = load(path)
    rows, replies = [], []
    with LLM(model) as llm:
        prompts = [llm.encode_chat(i["messages"], tools=normalize_tools(i.get("tools"))) for i in items]
        chosen = configs(llm, max_tokens)
        for cfg in select_configs(chosen, labels) if labels else chosen:
            start = time.perf_counter()
            outputs = []
            for k in range(0, len(prompts), batch_size):
                outputs += llm.generate(prompt_token_ids=prompts[k:k + batch_size], sampling_params=cfg.params)
            wall = time.perf_counter() - start
            scored = [(score(i, o.text), o) for i, o in zip(items, outputs)]
            replies += [{"config": cfg.label, "id": i["id"], "reply": o.text, **s} for i, (s, o) in zip(items, scored)]
            rows += [_row(cfg.label, group, results, wall) for group, results in groups(items, scored).items()]
    return rows, replies


def _row(label: str, group: str, results: list, wall: float) -> dict:
    from dlm_tiny.evaluate import wilson

    def share(key):
        marks = [s[key] for s, _ in results if key in s]
        return sum(marks) / len(marks) if marks else None
    values = sum(s.get("n_values", 0) for s, _ in results)
    passes = sum(o.num_forward_passes for _, o in results)
    cache_passes = sum(o.num_cache_passes for _, o in results)
    tokens = sum(max(1, o.num_generated_tokens) for _, o in results)
    hits = sum(s["correct"] for s, _ in results)
    return {"config": label, "group": group, "n": len(results), "correct": hits / len(results),
            "correct_ci95": wilson(hits, len(results)), "valid": share("valid"), "name": share("name"),
            "values": sum(s.get("values", 0) for s, _ in results) / values if values else None,
            "passes_per_token": passes / tokens, "cache_passes_per_token": cache_passes / tokens,
            "wall_s": wall if group == "all" else None}


def format_table(rows: list[dict]) -> str:
    """correct: the whole answer right (tool calls: name and arguments; JSON: every value); valid:
    a parseable call or object; name: one call, of the right tool; values: JSON values right;
    passes/token: denoising passes, and cache passes apart (evaluate.format_table says why)."""
    pct = lambda v: "" if v is None else f"{100 * v:.1f}%"      # noqa: E731
    lines = ["| config | group | n | correct | 95% CI | valid | name | values | passes/token | cache passes/token "
             "| wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["correct_ci95"]
        wall = "" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
        lines.append(f"| {r['config']} | {r['group']} | {r['n']} | {pct(r['correct'])} | {100 * low:.0f}-"
                     f"{100 * high:.0f}% | {pct(r['valid'])} | {pct(r['name'])} | {pct(r['values'])} | "
                     f"{r['passes_per_token']:.3f} | {r['cache_passes_per_token']:.3f} | {wall} |")
    return "\n".join(lines)
