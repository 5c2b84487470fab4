"""Is dlm-tiny's confidence honest, and how often does it refuse? (docs/dlm-tiny/findings.md, session 8)

Calibration: held-out tool-call and JSON replies are put on a 64-slot canvas (reply, then
end-of-text) with every reply slot masked, as in the first pass of a block, and one bidirectional
forward pass predicts them all. Predictions are bucketed by confidence (the top probability) and
each bucket reports how many were right. The threshold rule commits everything at or above its
threshold in one pass, so the 0.90-0.95 bucket's error rate is what threshold 0.9 pays.

Refusals: ``llada`` one token per step (dual cache) answers the held-out QA prompts; the probe
counts how many unanswerable questions it refused and how many answerable ones it wrongly refused.

Measured in session 8 on p3 (shipped), 200 per family (400 tool-call and JSON replies, ~2 min):
confidence 0.90-0.95 right 88.6% (528 predictions), 0.95-0.99 98.1% (1128), >= 0.99 99.9%
(5664), 0.70-0.90 74.7%; refused 1 of 23 unanswerable questions and 0 of 177 answerable ones.

    .venv/bin/python benchmarks/calibration_probe.py [MODEL_FOLDER] [--per-family 200]
"""

import argparse
from pathlib import Path

import torch

from dlm_backend.engine.layers import AttentionContext, attention_context
from dlm_backend.engine.llm import LLM
from dlm_backend.engine.loader import EMBEDDED_MODEL, load_model, read_config
from dlm_backend.engine.params import SamplingParams
from dlm_backend.training.corpus import NOT_IN_CONTEXT
from dlm_backend.training.evaluate import held_out, score

BUCKETS = [(0.0, 0.7), (0.7, 0.9), (0.9, 0.95), (0.95, 0.99), (0.99, 1.01)]
CANVAS = 64


def calibration(model, llm: LLM, examples, mask_id: int, eos_id: int) -> list[tuple[int, int]]:
    """[(right, total)] per bucket over every reply slot of ``examples``."""
    counts = [[0, 0] for _ in BUCKETS]
    for ex in examples:
        prompt = llm.encode_chat(ex.messages, tools=ex.tools)
        reply = llm.tokenizer.encode(ex.target + "<|im_end|>")[:CANVAS]
        ids = torch.tensor(prompt + [mask_id] * CANVAS)                      # [P + 64]
        L, P = len(ids), len(prompt)
        with torch.no_grad(), attention_context(AttentionContext(rows=(1, L), attend=torch.ones(1, L, L, dtype=torch.bool))):
            probs = model.compute_logits(model(ids, torch.arange(L))[P - 1:L - 1]).softmax(-1)   # [64, V]
        conf, top = probs.max(-1)
        for i, want in enumerate(reply):
            b = next(k for k, (lo, hi) in enumerate(BUCKETS) if lo <= float(conf[i]) < hi)
            counts[b][0] += int(top[i]) == want
            counts[b][1] += 1
    return [tuple(c) for c in counts]


def refusals(llm: LLM, examples) -> tuple[int, int, int, int]:
    """(unanswerable refused, unanswerable, answerable refused, answerable) under llada, dual."""
    params = SamplingParams(max_tokens=CANVAS, block_length=32, sampler="llada", steps=CANVAS, cache="dual")
    outs = llm.generate(prompt_token_ids=[llm.encode_chat(e.messages) for e in examples], sampling_params=params)
    said_absent = [score(e.__class__("qa", e.messages, NOT_IN_CONTEXT, expected={"answer": NOT_IN_CONTEXT}),
                         o.text)["exact"] for e, o in zip(examples, outs)]
    absent = [e.target == NOT_IN_CONTEXT for e in examples]
    return (sum(s and a for s, a in zip(said_absent, absent)), sum(absent),
            sum(s and not a for s, a in zip(said_absent, absent)), len(absent) - sum(absent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=str(EMBEDDED_MODEL))
    ap.add_argument("--per-family", type=int, default=200)
    args = ap.parse_args()
    config = read_config(Path(args.model))
    model = load_model(Path(args.model), config, torch.device("cpu"), torch.float32)
    llm = LLM(args.model)
    examples = held_out(args.per_family)
    copies = [e for e in examples if e.family in ("tool_call", "json")]
    print(f"calibration, {len(copies)} tool-call and JSON replies, whole reply masked:")
    for (lo, hi), (right, total) in zip(BUCKETS, calibration(model, llm, copies, config["mask_token_id"],
                                                            config["eos_token_id"])):
        print(f"  confidence {lo:.2f}-{min(hi, 1):.2f}: {total:5d} predictions, {right / max(total, 1):6.1%} right")
    refused, absent, wrong, answerable = refusals(llm, [e for e in examples if e.family == "qa"])
    print(f"QA refusals: {refused} of {absent} unanswerable questions refused; "
          f"{wrong} of {answerable} answerable ones refused")


if __name__ == "__main__":
    main()
