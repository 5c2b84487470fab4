"""Score the hand-written JSON items with the schema passed as ``response_format``.

The hand-written JSON items give their schema in the prompt's text, as a user prompting by hand
would, and the model must write the whole object. A framework's structured output (LangChain's
``with_structured_output(method="json_schema")``, an OpenAI client's ``response_format``) passes
the schema to the engine instead, which writes the keys and leaves each value to the model
(chat/json_writer.py). Scoring both ways separates "cannot write the JSON" from "cannot find the
values" (findings.md, "m1"). The schema is the first JSON object with ``properties`` in the
prompt; the one item without such an object (a key list) is left out.

    .venv/bin/python recipes/dlm_tiny/probes/forced_json.py [MODEL ...]     # default: the shipped model
"""

import argparse
import json

from dlm_backend import LLM
from dlm_backend.chat import ChatRequest
from dlm_backend.chat.run import complete
from dlm_tiny.handwritten import load, score


def schema_in(text: str) -> dict | None:
    """The first JSON object in ``text`` that has ``properties``, or None."""
    decoder = json.JSONDecoder()
    for start in (i for i, c in enumerate(text) if c == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("properties"), dict) and "foo" not in value["properties"]:
            return value      # LangChain's format instructions show a {"foo": ...} example schema first
    return None


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=[None])
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    items = [(i, schema_in(" ".join(m["content"] for m in i["messages"]))) for i in load(None) if i["category"] == "json"]
    items = [(i, s) for i, s in items if s is not None]
    for model in args.models:
        with LLM(model) as llm:
            params = llm.sampling_params(max_tokens=args.max_tokens)
            for forced in (False, True):
                got = [score(i, complete(llm, ChatRequest(i["messages"], params, response_format=_format(s) if forced else None)).content)
                       for i, s in items]
                values, asked = sum(g["values"] for g in got), sum(g["n_values"] for g in got)
                print(f"{model or 'dlm-tiny'} schema {'as response_format' if forced else 'in the prompt only'}: "
                      f"parse {100 * sum(g['valid'] for g in got) / len(got):.1f}%, all values right "
                      f"{100 * sum(g['correct'] for g in got) / len(got):.1f}%, values right {values}/{asked} (n={len(got)})")


if __name__ == "__main__":
    main()
