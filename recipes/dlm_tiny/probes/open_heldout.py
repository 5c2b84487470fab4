"""Score models on the open-ended families' own held-out prompts (another seed and entity split).

``dlm eval`` scores the template families; this asks whether a model learned the open families
in distribution at all, which separates "the generator does not cover hand-written prompts" from
"the model did not learn the task in its budget" (findings.md, the f-run and the g-run).

    .venv/bin/python recipes/dlm_tiny/probes/open_heldout.py MODEL [MODEL ...] [--per-family 40] [--keyed]
        [--prose-bank BANK]

``--keyed`` scores the keyed families (open_keys.py, open_key_tools.py) instead; each set is kept as it was so its
figures stay comparable across runs (the families are drawn round-robin from one seed, so a family
added later is drawn on its own). ``--prose-bank`` scores qa_prose on the bank's held-out articles.
"""

import argparse

from dlm_backend import LLM
from dlm_tiny import corpus, evaluate

OPEN = ["qa_open", "tool_open", "tool_result_open", "json_open"]
KEYED = ["qa_keyed", "tool_keyed"]
KEYED_LATER = ["json_keyed", "tool_result_keyed"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--per-family", type=int, default=40)
    ap.add_argument("--config", default="threshold 0.95, prefix, block 4")
    ap.add_argument("--keyed", action="store_true", help="score the keyed families instead")
    ap.add_argument("--prose-bank", default="", help="score qa_prose on this bank's held-out articles instead")
    args = ap.parse_args()
    sets = [["qa_prose"]] if args.prose_bank else [KEYED] + [[f] for f in KEYED_LATER] if args.keyed else [OPEN]
    config = evaluate.select_configs(evaluate.default_configs(), args.config)[0]
    examples = [e for fams in sets for e in corpus.generate(args.per_family * len(fams), seed=evaluate.EVAL_SEED,
                                                             split="eval", families=fams, prose_bank=args.prose_bank)]
    families = [f for fams in sets for f in fams]
    for model in args.models:
        with LLM(model) as llm:
            prompts = [llm.encode_chat(e.messages, tools=e.tools) for e in examples]
            texts = []
            for i in range(0, len(prompts), 16):
                texts += [o.text for o in llm.generate(prompt_token_ids=prompts[i:i + 16], sampling_params=config.params)]
        print(f"## {model} ({config.label})")
        for fam in families:
            scored = [(e, evaluate.score(e, t)) for e, t in zip(examples, texts) if e.family == fam]
            refusals = sum(e.target == corpus.NOT_IN_CONTEXT for e, _ in scored)
            valid = [s["valid"] for _, s in scored if "valid" in s]
            print(f"- {fam}: exact {sum(s['exact'] for _, s in scored)}/{len(scored)}"
                  + (f", valid {sum(valid)}/{len(valid)}" if valid else "")
                  + (f" ({refusals} to refuse)" if fam.startswith("qa") else ""))
        for e, t in [(e, t) for e, t in zip(examples, texts) if e.family == families[0]][:6]:
            print(f"  expected {e.target!r} got {t[:80]!r}")


if __name__ == "__main__":
    main()
