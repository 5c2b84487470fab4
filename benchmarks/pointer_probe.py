"""Where does dlm-tiny's pointer head look? (dlm_backend/training/pointer.py, docs/dlm-tiny/findings.md)

Held-out JSON and tool-call targets are given in full with every value's pieces masked, with
bidirectional attention as in decoding. From the token before each value's first piece (Dream
predicts position p + 1 at p), the probe reports:
- how often the pointer head's top key is a source: position j with token j - 1 equal to the
  first piece, inside the prompt;
- the head's total attention on such sources;
- how often the model predicts the first piece.

Measured in session 7, 59 first pieces:
- p1 at step 2250: top key 0.73, first piece 0.78.
- p1 at the end: top key 0.88, weight 0.87, first piece 0.95.
- p2 (shipped): top key 0.92, weight 0.89, first piece 0.98.
- b1 (no pointer head): first piece 0.75.

    .venv/bin/python benchmarks/pointer_probe.py [MODEL_FOLDER] [--layer 4]
"""

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer

from dlm_backend.engine.layers import AttentionContext, attention_context, rotate_qk
from dlm_backend.engine.llm import LLM
from dlm_backend.engine.loader import EMBEDDED_MODEL, load_model, read_config
from dlm_backend.training.evaluate import held_out


def first_pieces(example, tok: Tokenizer) -> tuple[list[int], list[list[int]]]:
    """The target's token ids, and for each value the indices of its pieces in them."""
    values = example.expected.get("object") or example.expected.get("arguments")
    enc = tok.encode(example.target, add_special_tokens=False)
    spans = []
    for value in values.values():
        text = json.dumps(value)
        quoted = isinstance(value, str)
        start = example.target.find(": " + text) + 2 + quoted
        end = start + len(text) - 2 * quoted
        pieces = [i for i, (a, b) in enumerate(enc.offsets) if start <= a < b <= end]
        if pieces:
            spans.append(pieces)
    return enc.ids, spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(EMBEDDED_MODEL))
    ap.add_argument("--layer", type=int, default=4)
    args = ap.parse_args()
    folder = Path(args.model)
    config = read_config(folder)
    model = load_model(folder, config, torch.device("cpu"), torch.float32)
    tok, llm = Tokenizer.from_file(str(folder / "tokenizer.json")), LLM(str(folder))
    att, seen = model.model.layers[args.layer].self_attn, {}
    att.register_forward_hook(lambda mod, inputs, out: seen.__setitem__("in", inputs))
    hd = att.head_dim
    q_head, kv_head = att.q_proj.out_features // hd - 1, att.k_proj.out_features // hd - 1
    n = looks = hits = 0
    weight = 0.0
    for ex in held_out(15):
        if ex.family not in ("json", "tool_call") or ex.expected.get("no_call"):
            continue
        prompt = llm.encode_chat(ex.messages, tools=ex.tools)
        target, spans = first_pieces(ex, tok)
        ids, P = prompt + target, len(prompt)
        x = torch.tensor(ids)
        for pieces in spans:
            x[[P + i for i in pieces]] = config["mask_token_id"]
        L = len(ids)
        with torch.no_grad(), attention_context(AttentionContext(rows=(1, L), attend=torch.ones(1, L, L, dtype=torch.bool))):
            hidden = model(x, torch.arange(L))                                   # [L, D]
            a, cos, sin = seen["in"]
            q, k = rotate_qk(att.q_proj(a).view(L, -1, hd), att.k_proj(a).view(L, -1, hd), cos, sin, full_precision=False)
            w = (q[:, q_head] @ k[:, kv_head].T / hd ** 0.5).softmax(-1)      # [L, L]
        for pieces in spans:
            p = P + pieces[0] - 1
            want = ids[p + 1]
            sources = [j for j in range(1, P + 1) if ids[j - 1] == want]
            n += 1
            looks += int(int(w[p].argmax()) in sources)
            weight += float(w[p, sources].sum()) if sources else 0.0
            hits += int(int(model.compute_logits(hidden[p:p + 1]).argmax()) == want)
    print(f"{n} first pieces: pointer's top key a source {looks / n:.2f}, weight on sources {weight / n:.2f}, "
          f"first piece predicted {hits / n:.2f}")


if __name__ == "__main__":
    main()
