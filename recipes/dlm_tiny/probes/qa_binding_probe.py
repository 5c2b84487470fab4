"""Does dlm-tiny bind an answer to the person asked about, or only to the attribute asked?

Held-out QA prompts are split by whether someone else in the context has the asked attribute
(``expected["distractor"]``, set by the corpus) and by whether the answer is in the context, then
answered with ``llada`` one token per pass (dual cache, block 32), the eval's reference config.

Measured on p3 (200 held-out QA prompts; findings.md): answerable with the attribute unique
134/134, answerable with a same-attribute distractor 20/43 (chance is about half), unanswerable 1/23.
The model had learned the attribute-type shortcut, which the training corpus allowed: most
contexts hold one value per attribute. ``dlm train --qa-hard`` adds the distractor.

    .venv/bin/python recipes/dlm_tiny/probes/qa_binding_probe.py [MODEL_FOLDER] [--per-family 200]
"""

import argparse
from collections import Counter

from dlm_backend import LLM, SamplingParams
from dlm_tiny.corpus import NOT_IN_CONTEXT
from dlm_tiny.evaluate import held_out, score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--per-family", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="the reply canvas; a first-stage checkpoint (40 end-of-text tokens at most "
                             "after a reply in training) reads a 64-token canvas as a long answer, use 16")
    args = parser.parse_args()
    llm = LLM(args.model)
    examples = [e for e in held_out(args.per_family) if e.family == "qa"]
    n = args.max_tokens
    params = SamplingParams(max_tokens=n, block_length=min(32, n), sampler="llada", steps=n, cache="dual")
    outputs = llm.generate(prompt_token_ids=[llm.encode_chat(e.messages) for e in examples], sampling_params=params)
    total, right = Counter(), Counter()
    for example, output in zip(examples, outputs):
        answerable = "unanswerable" if example.target == NOT_IN_CONTEXT else "answerable"
        other = "someone else has the attribute" if example.expected["distractor"] else "attribute unique"
        key = f"{answerable}, {other}"
        total[key] += 1
        right[key] += score(example, output.text)["exact"]
    print("| QA prompts | exact |\n|---|---|")
    for key in sorted(total):
        print(f"| {key} | {right[key]}/{total[key]} ({100 * right[key] / total[key]:.1f}%) |")


if __name__ == "__main__":
    main()
