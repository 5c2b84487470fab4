"""The hand-written set answered by SmolLM2-135M-Instruct, the prose teacher: a reference for what a
model 23 times dlm-tiny's size, trained on trillions of tokens, makes of the same prompts.

Each item is rendered exactly as dlm-tiny sees it (its ChatML template with Hermes tools; SmolLM2's own
template is ChatML without tools) and decoded greedily, one token a step, up to 128 tokens like
`dlm eval --set handwritten`. SmolLM2 writes calls as a JSON list inside the tags, so a second score
reads ``<tool_call>[{...}]</tool_call>`` as the call it holds. The GGUF is Q4_1, dequantised.

    python recipes/dlm_tiny/probes/teacher_handwritten.py --cache runs/prose/downloads   # ~10 min on 2 cores
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from write_prose_questions import TEACHER, fetch  # noqa: E402

from dlm_backend.chat.tool_calls import normalize_tools  # noqa: E402
from dlm_backend.engine.tokenizer import Tokenizer as ChatTokenizer  # noqa: E402
from dlm_tiny import handwritten  # noqa: E402
from dlm_tiny.teacher import load_teacher  # noqa: E402

SHIPPED = Path(__file__).parents[3] / "dlm_backend" / "assets" / "dlm-tiny"
LISTED = re.compile(r"<tool_call>\s*\[\s*(\{.*?\})\s*\]\s*</tool_call>", re.S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="runs/prose/downloads")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default=None, help="write every reply here (.jsonl)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    teacher = load_teacher(str(fetch(*TEACHER, Path(args.cache))))
    chat = ChatTokenizer(SHIPPED)
    items = handwritten.load()
    prompts = [chat.apply_chat_template(i["messages"], tools=normalize_tools(i.get("tools"))) for i in items]
    order = sorted(range(len(items)), key=lambda k: len(prompts[k]))     # batches of like lengths pad little
    replies, start = [""] * len(items), time.time()
    for k in tqdm(range(0, len(order), args.batch), desc="teacher", unit="batch"):
        chunk = order[k:k + args.batch]
        for j, text in zip(chunk, teacher.generate([prompts[j] for j in chunk], max_new_tokens=128, chat=False)):
            replies[j] = text
    wall = time.time() - start
    if args.out:
        Path(args.out).write_text("".join(json.dumps({"id": i["id"], "reply": r}) + "\n" for i, r in zip(items, replies)))
    # autoregressive: one forward pass a token
    outs = [SimpleNamespace(num_forward_passes=n, num_generated_tokens=n)
            for n in (len(teacher.tok.encode(r).ids) for r in replies)]
    rows = []
    for label, read in (("as written", lambda t: t), ("list calls read", lambda t: LISTED.sub(r"<tool_call>\1</tool_call>", t))):
        scored = [(handwritten.score(i, read(r)), o) for i, r, o in zip(items, replies, outs)]
        rows += [handwritten._row(f"SmolLM2-135M-Instruct, {label}", g, res, wall)
                 for g, res in handwritten.groups(items, scored).items()]
    print(handwritten.format_table(rows))


if __name__ == "__main__":
    main()
