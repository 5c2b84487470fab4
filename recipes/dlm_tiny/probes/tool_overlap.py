"""Which offered tool does the request's wording point to, without any model? On the hand-written set's
tool calls with two or more tools, and on the generator's tool families, pick the tool whose name and
description share the most words (3+ letters) with the user's turns, and, for a pretrained prior, the
tool whose mean SmolLM2 input embedding is closest to the request's. A word pick counts only when it
is the one best tool (a tie is a miss).

Word overlap is a floor for what reading the request gives: where it picks the right tool and the
model does not, the model has not learned to compare the request with the offered tools.

    python recipes/dlm_tiny/probes/tool_overlap.py --cache runs/prose/downloads      # 20 s
"""

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from write_prose_questions import TEACHER, fetch  # noqa: E402

from dlm_tiny import corpus  # noqa: E402
from dlm_tiny.teacher import load_teacher  # noqa: E402

HANDWRITTEN = Path(__file__).parents[1] / "eval" / "handwritten.jsonl"
CALLED = re.compile(r'"name":\s*"([^"]+)"')


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower().replace("_", " ")) if len(w) > 2}


def tool_text(tool: dict, part: str) -> str:
    fn = tool.get("function", tool)
    name, description = fn["name"].replace("_", " "), fn.get("description", "")
    return {"name": name, "description": description, "both": name + " " + description}[part]


def one_best(scores: list[float]) -> int | None:
    best = max(scores)
    return scores.index(best) if scores.count(best) == 1 else None


def cases_handwritten() -> list[tuple[str, list[dict], str]]:
    items = [json.loads(line) for line in HANDWRITTEN.read_text().splitlines() if line.strip()]
    return [(" ".join(m["content"] for m in r["messages"] if m["role"] == "user"), r["tools"], r["expected"]["name"])
            for r in items if r["category"] == "tool_call" and len(r.get("tools") or []) > 1 and r["expected"].get("name")]


def cases_generated(family: str, n: int) -> list[tuple[str, list[dict], str]]:
    out = []
    for e in corpus.generate(n, seed=3, split="eval", families=[family]):
        called = CALLED.search(e.target) if "<tool_call>" in e.target else None
        if e.tools and len(e.tools) > 1 and called:
            out.append((" ".join(m["content"] for m in e.messages if m["role"] == "user"), e.tools, called.group(1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="runs/prose/downloads")
    ap.add_argument("--generated", type=int, default=600, help="examples drawn per generator family")
    args = ap.parse_args()
    teacher = load_teacher(str(fetch(*TEACHER, Path(args.cache))))
    table = teacher.w["token_embd.weight"]
    table = table - table.mean(0)         # the shared direction makes every mean embedding alike

    def embed(text: str) -> torch.Tensor:
        return F.normalize(table[teacher.tok.encode(" " + text).ids].mean(0), dim=0)

    print("| set | items | chance | overlap: name | description | both | SmolLM2 embeddings |")
    print("|---|---|---|---|---|---|---|")
    sets = {"hand-written": cases_handwritten()}
    sets |= {f"generator {f}": cases_generated(f, args.generated) for f in ("tool_call", "tool_open", "tool_keyed")}
    for label, cases in sets.items():
        chance = sum(1 / len(tools) for _, tools, _ in cases)
        right = {}
        for part in ("name", "description", "both"):
            right[part] = sum(
                (i := one_best([len(words(user) & words(tool_text(t, part))) for t in tools])) is not None
                and tools[i].get("function", tools[i])["name"] == want for user, tools, want in cases)
        near = [max(tools, key=lambda t: float(embed(user) @ embed(tool_text(t, "both")))) for user, tools, _ in cases]
        right["emb"] = sum(t.get("function", t)["name"] == want for t, (_, _, want) in zip(near, cases))
        n = len(cases)
        cells = " | ".join(f"{100 * right[p] / n:.1f}" for p in ("name", "description", "both", "emb"))
        print(f"| {label} | {n} | {100 * chance / n:.1f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
