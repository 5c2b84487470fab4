"""How many of a prompt set's words a training mix never shows: the hand-written set against the
generator's own held-out prompts, to size how far the hand-written wording lies from the corpus.

    .venv/bin/python recipes/dlm_tiny/probes/vocab_overlap.py --family-weights "$W" [--examples 6000] \
        [--replies runs/eval-hw-n1/replies.jsonl ...]

``--replies`` (a ``dlm eval --set handwritten`` output) splits each model's hand-written score into the
half of the items with fewer unseen words and the half with more, which asks whether the unseen
words are what the model fails on.

Words are runs of ASCII letters, compared lowercased; the generator's held-out prompts carry fresh
names by design (the eval split's entities), so their unseen share is the floor to read against.
"""

import argparse
import collections
import json
import re
from pathlib import Path

from tokenizers import Tokenizer

from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL
from dlm_tiny import corpus, evaluate, handwritten


def words(messages: list[dict]) -> list[str]:
    return [w.lower() for m in messages for w in re.findall(r"[A-Za-z]+", str(m.get("content") or ""))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family-weights", required=True, help="the mix, as dlm train takes it")
    ap.add_argument("--examples", type=int, default=6000, help="training examples drawn from the mix")
    ap.add_argument("--heldout", type=int, default=300, help="generator held-out prompts")
    ap.add_argument("--replies", nargs="*", default=[], help="replies.jsonl files of hand-written evals")
    args = ap.parse_args()
    families = [kv.split("=")[0] for kv in args.family_weights.split(",")]
    # Any training seed will do: the count is of the mix's wording, which every seed draws alike.
    seen = collections.Counter(w for e in corpus.generate(args.examples, seed=123, families=families)
                               for w in words(e.messages))
    items = handwritten.load()
    tok = Tokenizer.from_file(str(EMBEDDED_MODEL / "tokenizer.json"))
    sets = {"generator held-out": [words(e.messages) for e in corpus.generate(
                args.heldout, seed=evaluate.EVAL_SEED, split="eval", families=families)],
            "hand-written": [words(i["messages"]) for i in items]}
    for name, prompts in sets.items():
        ws = [w for p in prompts for w in p]
        pieces = sum(len(tok.encode(w).ids) for w in ws) / len(ws)
        unseen = sum(seen[w] == 0 for w in ws) / len(ws)
        print(f"{name}: {len(ws)} words, {pieces:.2f} tokenizer pieces a word, never in the mix {100 * unseen:.1f}%")
    share = {i["id"]: sum(seen[w] == 0 for w in ws) / max(1, len(ws)) for i, ws in zip(items, sets["hand-written"])}
    for path in args.replies:
        right = {r["id"]: r["correct"] for r in map(json.loads, Path(path).read_text().splitlines())
                 if r["config"].startswith("default")}           # the model's own decoding
        for cat in ("qa", "all"):
            ids = sorted((i["id"] for i in items if cat == "all" or i["category"] == cat), key=share.get)
            halves = ids[:len(ids) // 2], ids[len(ids) // 2:]
            print(f"{path} {cat}: " + ", ".join(
                f"{sum(right[k] for k in h)}/{len(h)} right where {100 * sum(share[k] for k in h) / len(h):.0f}% "
                f"of words are unseen" for h in halves))


if __name__ == "__main__":
    main()
