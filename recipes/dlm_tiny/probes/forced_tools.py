"""Score the hand-written tool-call items with the call's structure forced by the tool's schema.

At the default ``tool_choice="auto"`` the model writes the whole call, and a miss may be the JSON,
the tool's name or the argument values. With ``tool_choice="required"`` the engine writes the
structure (a name pass over the offered tools, then each argument key by key from the schema:
chat/plan.py), so what is left wrong is what the model chose: the tool and the values. That
separates "cannot write JSON" from "cannot pick the tool" from "cannot copy the values"
(findings.md, "Where the tool calls fail").

    .venv/bin/python recipes/dlm_tiny/probes/forced_tools.py [MODEL ...]     # default: the shipped model
"""

import argparse
import json

from dlm_backend import LLM
from dlm_backend.chat import ChatRequest
from dlm_backend.chat.run import complete
from dlm_tiny.handwritten import _tool_properties, arguments_ok, load


def marks(item: dict, result) -> dict:
    """The hand-written scorer's marks (handwritten.score) read from the calls the engine returned:
    written back into text, a value holding "</tool_call>" would cut the call short."""
    calls, want = result.tool_calls, item["expected"]
    name = len(calls) == 1 and calls[0]["function"]["name"] == want["name"]
    return {"valid": bool(calls) and not result.invalid_tool_calls, "name": name,
            "correct": name and arguments_ok(json.loads(calls[0]["function"]["arguments"]), want,
                                             _tool_properties(item, want["name"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=[None])
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    items = [i for i in load(None) if i["category"] == "tool_call"]
    for model in args.models:
        with LLM(model) as llm:
            params = llm.sampling_params(max_tokens=args.max_tokens)
            for choice in ("auto", "required"):
                got = [marks(i, complete(llm, ChatRequest(i["messages"], params, tools=i["tools"], tool_choice=choice)))
                       for i in items]
                share = {k: 100 * sum(m[k] for m in got) / len(got) for k in ("valid", "name", "correct")}
                print(f"{model or 'dlm-tiny'} tool_choice={choice}: valid {share['valid']:.1f}%, right tool "
                      f"{share['name']:.1f}%, right tool and arguments {share['correct']:.1f}% (n={len(got)})")


if __name__ == "__main__":
    main()
