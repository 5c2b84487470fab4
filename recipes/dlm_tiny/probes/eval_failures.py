"""List the held-out answers a model gets wrong, one family and one eval config at a time.

``dlm eval`` reports rates; this prints the failing prompts, what was expected and what the model
wrote, so a missed target can be read rather than guessed at. On the tool-call validity target
(findings.md, the stage-3 and stage-4 tries) every three-stage model missed 5 or 6 of 200 in two
ways, a closing fragment written twice and a rare word copied with its closing quote lost; the
shipped y6r misses 3.

Needs the recipe installed (``pip install -e recipes/dlm_tiny``).

    .venv/bin/python recipes/dlm_tiny/probes/eval_failures.py MODEL [MODEL ...] [--family tool_call] [--invalid]
        [--config "llada 1 tok/step, dual"] [--per-family 200] [--block-length 32]
"""

import argparse

from dlm_backend import LLM
from dlm_tiny import evaluate


def failures(model: str, family: str, config: evaluate.EvalConfig, per_family: int, invalid: bool) -> list:
    """``(example, answer text)`` for each held-out example of ``family`` the model fails."""
    examples = [e for e in evaluate.held_out(per_family) if e.family == family]
    llm = LLM(model)
    prompts = [llm.encode_chat(e.messages, tools=e.tools) for e in examples]
    texts = []
    for i in range(0, len(prompts), 16):
        texts += [o.text for o in llm.generate(prompt_token_ids=prompts[i:i + 16], sampling_params=config.params)]
    key = "valid" if invalid else "exact"
    return [(e, t) for e, t in zip(examples, texts) if not evaluate.score(e, t).get(key, True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--family", default="tool_call", choices=evaluate.corpus.EVAL_FAMILIES)
    ap.add_argument("--config", default="llada 1 tok/step, dual")
    ap.add_argument("--per-family", type=int, default=200)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--invalid", action="store_true", help="list invalid answers (tool calls, JSON), not inexact")
    args = ap.parse_args()
    config = evaluate.select_configs(evaluate.default_configs(block_length=args.block_length), args.config)[0]
    for model in args.models:
        failed = failures(model, args.family, config, args.per_family, args.invalid)
        print(f"## {model}: {len(failed)} {'invalid' if args.invalid else 'wrong'} ({args.family}, {config.label}, "
              f"block {config.params.block_length})")
        for example, text in failed:
            print(f"- prompt: {example.messages[-1]['content'][:160]!r}")
            print(f"  expected: {example.expected}")
            print(f"  got: {text[:300]!r}")


if __name__ == "__main__":
    main()
