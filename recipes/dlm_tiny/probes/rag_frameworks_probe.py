"""Grounded QA in the RAG frameworks' own prompts: does dlm-tiny answer LlamaIndex and LangChain as it answers the eval?

The held-out QA family wraps one plain passage in the corpus's own prompts. A retrieval pipeline sends
its default prompt instead: LlamaIndex's query engine a system prompt plus ``file: ...`` metadata above
each retrieved node, LangChain's hub prompt its "say that you don't know" wording
(``dlm_tiny/rag_templates.py``). This probe draws held-out QA (eval seed and entity split)
with every prompt in one of those templates and scores it as the eval does, per template and split by
answerable / not in context, with ``llada`` one token per pass (dual cache, block 32).

Why: the y4 stage met the eval's QA target (97.0%) yet answered LlamaIndex's prompt for "Where does
Velmora live?" with "The context does not say."; one integration test caught it, this counts it.

    .venv/bin/python recipes/dlm_tiny/probes/rag_frameworks_probe.py [MODEL_FOLDER ...] [--per-family 200]
"""

import argparse
from collections import Counter

from dlm_backend import LLM, SamplingParams
from dlm_tiny import corpus
from dlm_tiny.evaluate import EVAL_SEED, score
from dlm_tiny.rag_templates import TEMPLATES


def probe(model: str | None, per_family: int) -> tuple[Counter, Counter]:
    llm = LLM(model)
    examples = corpus.generate(per_family, seed=EVAL_SEED, split="eval", families=["qa"], rag_templates=1.0)
    params = SamplingParams(max_tokens=64, block_length=32, sampler="llada", steps=64, cache="dual")
    outputs = []
    for i in range(0, len(examples), 16):
        batch = examples[i:i + 16]
        outputs += llm.generate(prompt_token_ids=[llm.encode_chat(e.messages) for e in batch], sampling_params=params)
    total, right = Counter(), Counter()
    for example, output in zip(examples, outputs):
        kind = "not in context" if example.target == corpus.NOT_IN_CONTEXT else "answerable"
        hit = score(example, output.text)["exact"]
        for key in ("all", example.expected["template"], kind):
            total[key] += 1
            right[key] += hit
    return total, right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=[None], help="checkpoint folders (default: the embedded dlm-tiny)")
    parser.add_argument("--per-family", type=int, default=200)
    args = parser.parse_args()
    results = [probe(model, args.per_family) for model in args.models]
    keys = ["all", *TEMPLATES, "answerable", "not in context"]
    print("| QA prompts | " + " | ".join(str(m or "embedded") for m in args.models) + " |")
    print("|---|" + "---|" * len(args.models))
    for key in keys:
        cells = [f"{right[key]}/{total[key]} ({100 * right[key] / max(1, total[key]):.1f}%)"
                 for total, right in results]
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
