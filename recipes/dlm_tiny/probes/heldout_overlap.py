"""How many held-out prompts a model saw word for word in training, and its score without them.

The held-out set comes from another seed and the evaluation entity split, so no QA, tool-result or
JSON prompt repeats (they are built around names). Arithmetic, list and chat prompts hold no
entities: "What is 12 plus 30?" is as likely in a 120k-example training corpus as in the held-out
set. This regenerates the training corpora of a run from its ``train_config.json`` files, counts
held-out prompts (messages and tools) that occur in them, and with ``--model`` scores the `llada`
reference config on the seen and unseen parts of each family that has any.

    .venv/bin/python recipes/dlm_tiny/probes/heldout_overlap.py runs/dlm-tiny-z{1,2,3,4}/train_config.json \
        [--model FOLDER] [--per-family 200]

Each stage of ``train.sh`` writes its ``train_config.json`` before its first step.
"""

import argparse
import json
from pathlib import Path

from dlm_backend import LLM
from dlm_tiny import corpus
from dlm_tiny.evaluate import default_configs, held_out, score, select_configs
from dlm_tiny.train import parse_weights


def prompt_key(example: corpus.Example) -> str:
    return json.dumps([example.messages, example.tools], sort_keys=True)


def training_prompts(config_paths: list[str]) -> set[str]:
    seen = set()
    for path in config_paths:
        cfg = json.loads(Path(path).read_text())
        examples = corpus.generate(cfg["num_examples"], seed=cfg["seed"], split="train",
                                   weights=parse_weights(cfg.get("family_weights", "")),
                                   unanswerable=cfg.get("unanswerable", 0.15), qa_hard=cfg.get("qa_hard", 0.0),
                                   rag_templates=cfg.get("rag_templates", 0.0))
        seen |= {prompt_key(e) for e in examples}
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="+", help="the run's train_config.json files, one per stage")
    parser.add_argument("--model", default=None, help="score llada 1 tok/step (dual) on seen and unseen prompts")
    parser.add_argument("--per-family", type=int, default=200)
    args = parser.parse_args()
    seen = training_prompts(args.configs)
    examples = held_out(args.per_family)
    flags = [prompt_key(e) in seen for e in examples]
    families = corpus.EVAL_FAMILIES
    counts = {f: sum(s for e, s in zip(examples, flags) if e.family == f) for f in families}
    print(f"{len(seen)} distinct training prompts from {len(args.configs)} corpora\n")
    print("| family | held-out | seen in training |" + (" exact, seen | exact, unseen |" if args.model else ""))
    print("|---|---|---|" + ("---|---|" if args.model else ""))
    scores = {}
    if args.model:
        llm = LLM(args.model)
        cfg = select_configs(default_configs(), "llada 1 tok/step, dual")[0]
        chosen = [i for i, e in enumerate(examples) if counts[e.family]]
        prompts = [llm.encode_chat(examples[i].messages, tools=examples[i].tools) for i in chosen]
        outputs = []
        for at in range(0, len(prompts), 16):
            outputs += llm.generate(prompt_token_ids=prompts[at:at + 16], sampling_params=cfg.params)
        scores = {i: score(examples[i], out.text)["exact"] for i, out in zip(chosen, outputs)}
    for f in families:
        n = sum(e.family == f for e in examples)
        row = f"| {f} | {n} | {counts[f]} |"
        if args.model:
            cells = []
            for want in (True, False):
                hits = [scores[i] for i, e in enumerate(examples) if e.family == f and flags[i] == want and i in scores]
                cells.append(f"{sum(hits)}/{len(hits)}" if hits else "")
            row += f" {cells[0]} | {cells[1]} |"
        print(row)


if __name__ == "__main__":
    main()
