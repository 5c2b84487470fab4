"""A scripted model for tests: it "knows" one answer text and predicts it token by token.

Registered like any family (architecture ``ScriptedForTests``, through the ``register_models`` hook),
so a test drives the engine's real loop (scheduler, runner, samplers, templates, stop strings) with a
model whose answer is known. At a masked slot whose left context since the answer's start is all
committed and decodes to a prefix of the script, it predicts the script's next token with logit 30;
everywhere else it predicts nothing (all logits 0, so no sampler commits there before the slot to its
left). The answer starts after the last occurrence of the config's ``answer_marker`` token ids (the
chat template's assistant header). It reads the whole canvas, so requests use ``cache="none"``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from torch import nn

from dlm_backend import hookimpl
from dlm_backend.engine.models.base import DiffusionLM, ModelArgs

ARCH = "ScriptedForTests"
CONFIDENT = 30.0


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: how a byte-level BPE token's string maps to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class ScriptedLM(DiffusionLM):
    def __init__(self, args: ModelArgs, script: str, marker: list[int], tokenizer_file: str):
        super().__init__(args)
        self.script, self.marker = script.encode(), marker
        tok = Tokenizer.from_file(tokenizer_file)
        alphabet, special = _byte_level_alphabet(), {t.content for t in tok.get_added_tokens_decoder().values()}
        # Bytes of every token, and the token of every byte string (the longest match wins below).
        self.bytes = {i: t.encode() if t in special else bytes(alphabet[c] for c in t)
                      for t, i in tok.get_vocab().items()}
        self.token_of = {b: i for i, b in sorted(self.bytes.items(), key=lambda x: x[0], reverse=True)
                         if i not in {tok.token_to_id(t) for t in special}}
        self.longest = max(len(b) for b in self.token_of)
        self.dummy = nn.Parameter(torch.zeros(1))           # checkpoints hold a tensor

    @classmethod
    def from_config(cls, c: dict) -> "ScriptedLM":
        args = ModelArgs(vocab_size=c["vocab_size"], hidden_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                         intermediate_size=8, max_positions=c.get("max_position_embeddings", 4096),
                         rope_theta=10000.0, norm_eps=1e-6, mask_token_id=c["mask_token_id"],
                         eos_token_ids=(c["eos_token_id"],))
        return cls(args, c["script"], c["answer_marker"], c["tokenizer_file"])

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        return cls.from_config(c).args

    def head(self):
        raise TypeError("the scripted model's hidden states are its logits")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ids, pos = input_ids.tolist(), positions.tolist()
        out = torch.zeros(len(ids), self.args.vocab_size)                 # [T, V]
        starts = [i for i, p in enumerate(pos) if p == 0] + [len(ids)]
        for a, b in zip(starts, starts[1:]):                               # one packed sequence each
            self._predict(ids[a:b], out[a:b])
        return out

    def _predict(self, seq: list[int], out: torch.Tensor) -> None:
        m, n = self.marker, len(self.marker)
        begin = max((i + n for i in range(len(seq) - n + 1) if seq[i:i + n] == m), default=None)
        if begin is None:
            return
        mask = self.args.mask_token_id
        for p in range(begin, len(seq)):
            if seq[p] != mask:
                continue
            written = b"".join(self.bytes[t] for t in seq[begin:p])
            if self.script.startswith(written):
                rest = self.script[len(written):]
                nxt = next((self.token_of[rest[:k]] for k in range(min(len(rest), self.longest), 0, -1)
                            if rest[:k] in self.token_of), self.args.eos_token_ids[0])
                out[p, nxt] = CONFIDENT
            break                                                          # only the first mask is known


def write_scripted_checkpoint(dest: Path, chat_folder: Path, script: str, marker_text: str) -> Path:
    """A ``ScriptedForTests`` folder with ``chat_folder``'s tokenizer and chat template, scripted to
    answer ``script`` after ``marker_text`` (the template's assistant header)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dest / name).write_bytes((chat_folder / name).read_bytes())
    tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
    config = {"architectures": [ARCH], "vocab_size": tok.get_vocab_size(), "script": script,
              "answer_marker": tok.encode(marker_text, add_special_tokens=False).ids,
              "mask_token_id": tok.token_to_id("<|mask|>") or tok.token_to_id("<|mdm_mask|>"),
              "eos_token_id": tok.token_to_id("<|endoftext|>"), "tokenizer_file": str(dest / "tokenizer.json")}
    (dest / "config.json").write_text(json.dumps(config))
    save_file({"dummy": torch.zeros(1)}, str(dest / "model.safetensors"))
    return dest


@hookimpl
def register_models(register):
    """This module is a plugin: ``load_plugins().register(scripted_model, name=...)``."""
    register(ARCH, "tests.scripted_model:ScriptedLM")
