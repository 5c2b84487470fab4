"""The GGUF teacher on a tiny random llama written here: batching must not change what a row writes."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the teacher reads GGUF files: pip install -e \"recipes/dlm_tiny[teacher]\"")

from dlm_tiny.teacher import load_teacher  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "probes"))

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, the base vocabulary of a byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = [b for b in range(256) if b not in keep]
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(len(extra))]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher") / "tiny.gguf"
    tokens = SPECIAL + byte_alphabet() + ["Ġt", "he", "Ġthe"]
    merges = ["Ġ t", "h e", "Ġt he"]
    dim, ff, layers, heads, kv_heads = 32, 64, 2, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(256)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(merges)
    w.add_eos_token_id(SPECIAL.index("<|im_end|>"))
    rng = np.random.default_rng(0)
    hd = dim // heads

    def add(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))

    add("token_embd.weight", len(tokens), dim)
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, np.float32))
        add(p + "attn_q.weight", heads * hd, dim)
        add(p + "attn_k.weight", kv_heads * hd, dim)
        add(p + "attn_v.weight", kv_heads * hd, dim)
        add(p + "attn_output.weight", dim, heads * hd)
        add(p + "ffn_gate.weight", ff, dim)
        add(p + "ffn_up.weight", ff, dim)
        add(p + "ffn_down.weight", dim, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def teacher(gguf_path):
    return load_teacher(str(gguf_path))


def test_tokenizer_round_trips_and_keeps_control_tokens_whole(teacher):
    text = "Sales fell 4.3% to $1.13bn (£600m),\n\tthe firm said."
    assert teacher.tok.decode(teacher.tok.encode(text).ids) == text
    assert teacher.tok.encode("<|im_end|>").ids == [SPECIAL.index("<|im_end|>")]


def test_a_batch_writes_what_each_prompt_writes_alone(teacher):
    prompts = ["the cat", "a much longer prompt than the first one, with more words in it"]
    batched = teacher.generate(prompts, max_new_tokens=8)
    assert batched == [teacher.generate([p], max_new_tokens=8)[0] for p in prompts]
    assert teacher.generate(prompts, max_new_tokens=8, chat=False) != batched      # the chat wrapper is read


def test_sampling_is_seeded(teacher):
    runs = [teacher.generate(["the"] * 3, max_new_tokens=8, temperature=1.0, seed=s) for s in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]


def test_the_cut_probe_with_every_layer_is_the_teacher(teacher, gguf_path):
    """probes/teacher_cuts.py scores cuts of the teacher: kept whole, it must compute the teacher's own
    next-token logits, and its cut tokenizer must stop at the merges it keeps."""
    cuts = importlib.import_module("teacher_cuts")
    ids = torch.tensor([[5, 40, 77, 12, 99, 3]])
    whole = cuts.Cut(teacher, list(range(teacher.cfg.n_layer)), k=teacher.tok.get_vocab_size())
    cache = (1, teacher.cfg.n_kv_head, 8, teacher.head_dim)
    kv = [(torch.zeros(cache), torch.zeros(cache)) for _ in range(teacher.cfg.n_layer)]
    own = teacher(ids, torch.arange(6)[None], kv, 0, torch.tensor([[True] * 6 + [False] * 2]))
    torch.testing.assert_close(whole(ids)[0, -1], own[0], rtol=1e-4, atol=1e-4)
    n = teacher.tok.get_vocab_size()
    assert cuts.cut_tokenizer(gguf_path, n).encode(" the").ids == [n - 1]                 # "Ġthe", the last merge
    assert cuts.cut_tokenizer(gguf_path, n - 1).encode(" the").ids == [n - 3, n - 2]      # "Ġt" + "he"
