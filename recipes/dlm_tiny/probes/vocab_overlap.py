"""How many of a prompt set's words a training mix never shows: the hand-written set against the
generator's own held-out prompts, to size how far the hand-written wording lies from the corpus.

    .venv/bin/python recipes/dlm_tiny/probes/vocab_overlap.py --family-weights "$W" [--examples 6000]

Words are runs of ASCII letters, compared lowercased; the generator's held-out prompts carry fresh
names by design (the eval split's entities), so their unseen share is the floor to read against.
"""

import argparse
import collections
import re

from tokenizers import Tokenizer

from dlm_backend.engine.loader import EMBEDDED_MODEL
from dlm_tiny import corpus, evaluate, handwritten


def words(messages: list[dict]) -> list[str]:
    return [w.lower() for m in messages for w in re.findall(r"[A-Za-z]+", str(m.get("content") or ""))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family-weights", required=True, help="the mix, as dlm train takes it")
    ap.add_argument("--examples", type=int, default=6000, help="training examples drawn from the mix")
    ap.add_argument("--heldout", type=int, default=300, help="generator held-out prompts")
    args = ap.parse_args()
    families = [kv.split("=")[0] for kv in args.family_weights.split(",")]
    seen = collections.Counter(w for e in corpus.generate(args.examples, seed=123, families=families)
                               for w in words(e.messages))
    tok = Tokenizer.from_file(str(EMBEDDED_MODEL / "tokenizer.json"))
    sets = {"generator held-out": [words(e.messages) for e in corpus.generate(
                args.heldout, seed=evaluate.EVAL_SEED, split="eval", families=families)],
            "hand-written": [words(i["messages"]) for i in handwritten.load()]}
    for name, prompts in sets.items():
        ws = [w for p in prompts for w in p]
        pieces = sum(len(tok.encode(w).ids) for w in ws) / len(ws)
        unseen = sum(seen[w] == 0 for w in ws) / len(ws)
        print(f"{name}: {len(ws)} words, {pieces:.2f} tokenizer pieces a word, never in the mix {100 * unseen:.1f}%")


if __name__ == "__main__":
    main()
