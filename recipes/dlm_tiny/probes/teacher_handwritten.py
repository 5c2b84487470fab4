"""The hand-written set answered by SmolLM2-135M-Instruct, the prose teacher: a reference for what a
model 23 times dlm-tiny's size, trained on trillions of tokens, makes of the same prompts.

Each item is rendered exactly as dlm-tiny sees it (its ChatML template with Hermes tools; SmolLM2's own
template is ChatML without tools) and decoded greedily, one token a step, up to 128 tokens like
`dlm eval --set handwritten`. SmolLM2's model card has calls written as a JSON list inside the tags,
so a second score reads ``<tool_call>[{...}]</tool_call>`` as the call it holds. The GGUF is Q4_1, dequantised.

    python recipes/dlm_tiny/probes/teacher_handwritten.py --cache runs/prose/downloads   # 3 min on 2 cores
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
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer as ChatTokenizer  # noqa: E402
from dlm_tiny import handwritten  # noqa: E402
from dlm_tiny.teacher import load_teacher  # noqa: E402

SHIPPED = Path(__file__).parents[3] / "dlm_backend" / "assets" / "dlm-tiny"
LISTED = re.compile(r"<tool_call>\s*\[\s*(\{.*?\})\s*(?:,.*?)?\]\s*</tool_call>", re.S)
# SmolLM2-Instruct's function-calling system prompt, as its model card gives it (SmolLM2-1.7B-Instruct,
# instructions_function_calling.md): tools as a JSON list, calls as a JSON list inside <tool_call>.
NATIVE_TOOLS = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. \n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. \n"
    "If none of the functions can be used, point it out and refuse to answer. \n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. If no function call is "
    "needed, please make the tool calls an empty list '[]'.\n"
    "<tool_call>[\n{{\"name\": \"func_name1\", \"arguments\": {{\"argument1\": \"value1\", \"argument2\": "
    "\"value2\"}}}},\n... (more tool calls as required)\n]</tool_call>")


def native_prompt(item: dict) -> str:
    """An item with tools in SmolLM2's own function-calling prompt and ChatML (its template has no tools)."""
    system = NATIVE_TOOLS.format(tools=json.dumps([t.get("function", t) for t in item["tools"]]))
    turns = [m for m in item["messages"] if m["role"] != "system"]
    own = [m["content"] for m in item["messages"] if m["role"] == "system"]
    text = f"<|im_start|>system\n{system}" + "".join("\n\n" + c for c in own) + "<|im_end|>\n"
    for m in turns:
        role = "user" if m["role"] == "tool" else m["role"]
        content = m.get("content") or json.dumps([c.get("function", c) for c in m.get("tool_calls", [])])
        text += f"<|im_start|>{role}\n{content}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="runs/prose/downloads")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default=None, help="write every reply here (.jsonl)")
    ap.add_argument("--native-tools", action="store_true",
                    help="tool-call items only, in SmolLM2's own function-calling prompt")
    args = ap.parse_args()
    torch.set_num_threads(2)
    teacher = load_teacher(str(fetch(*TEACHER, Path(args.cache))))
    chat = ChatTokenizer(SHIPPED)
    items = handwritten.load()
    if args.native_tools:
        items = [i for i in items if i["category"] == "tool_call"]
        prompts = [native_prompt(i) for i in items]
    else:
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
