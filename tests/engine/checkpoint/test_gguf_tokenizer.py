"""A GGUF file's tokenizer and chat template, rebuilt from its metadata (engine/checkpoint/
gguf_tokenizer.py). Every file here is written by tests/engine/checkpoint/gguf_writer.py in llama.cpp's converter layout
(LLaDAModel, DreamModel), from the parity fixtures' weights and the test tokenizer of tests/helpers.py."""

import json

import gguf
import numpy as np
import pytest
from tests.engine.checkpoint.gguf_writer import TEXTS, finish, write_gguf, chat_gguf as _chat_gguf
from tests.helpers import CHATML, make_chat_checkpoint
from tokenizers import Regex, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.checkpoint.gguf_file import GGUFFile
from dlm_backend.engine.checkpoint.gguf_tokenizer import LLAMA3, QWEN2
from dlm_backend.engine.checkpoint.tokenizer import Tokenizer


# --- (c) tokenizer and chat template from the metadata ---------------------------------------------

def _variant(folder, pre: str):
    """The fixture's tokenizer.json as Qwen2's (Dream's) or Llama 3's are built: their split regex
    before byte-level BPE (and NFC for Qwen2, whole-word lookup for Llama 3)."""
    data = json.loads((folder / "tokenizer.json").read_text())
    tok = HFTokenizer.from_str(json.dumps(data))
    regex = QWEN2 if pre == "qwen2" else LLAMA3
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = pre == "llama-bpe"
    (folder / "tokenizer.json").write_text(json.dumps(data))


@pytest.mark.parametrize("family, pre", [("dream", "gpt-2"), ("llada", "gpt-2"), ("dream", "qwen2"),
                                         ("llada", "llama-bpe")])
def test_the_tokenizer_built_from_metadata_encodes_and_decodes_as_tokenizer_json(tmp_path, family, pre):
    folder = make_chat_checkpoint(tmp_path / family, family)
    if pre != "gpt-2":
        _variant(folder, pre)
    path = write_gguf(folder, tmp_path / "t.gguf", pre=pre)
    want, got = Tokenizer(folder), GGUFFile(path).tokenizer()
    for text in TEXTS:
        ids = want.encode(text)
        assert got.encode(text) == ids, text
        assert got.decode(ids) == want.decode(ids) and got.decode(ids, False) == want.decode(ids, False)
    # gguf.SpecialVocab takes a BOS id config.json names when tokenizer_config.json has none (Dream's 302).
    assert got.special_tokens.items() >= want.special_tokens.items()
    assert got.vocab_size == want.vocab_size
    assert got.control_tokens().ids == want.control_tokens().ids
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2 + 2?"}]
    assert got.chat_template == want.chat_template
    assert got.apply_chat_template(messages) == want.apply_chat_template(messages)
    assert got.end_of_turn_ids() == want.end_of_turn_ids()


def test_named_chat_templates_come_back_by_name(tmp_path):
    folder = make_chat_checkpoint(tmp_path / "dream", "dream")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": "{{ tools }}"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    got = GGUFFile(write_gguf(folder, tmp_path / "t.gguf")).tokenizer()
    assert got.templates == {"default": CHATML, "tool_use": "{{ tools }}"}
    assert got.renders_tools


def test_a_file_without_a_vocabulary_loads_for_token_ids(tmp_path):
    _, path = _chat_gguf(tmp_path, "llada")
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "llada")
    for field in reader.fields.values():
        if field.name.startswith(("llada.", "diffusion.")):
            w.add_key_value(field.name, field.contents(), field.types[0])
    w.add_mask_token_id(300)
    w.add_eos_token_id(301)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data))
    finish(w)
    with LLM(str(tmp_path / "bare.gguf")) as llm:
        assert llm.engine.checkpoint.tokenizer is None
        out = llm.generate(prompt_token_ids=[18, 6, 128], sampling_params=SamplingParams(max_tokens=8, steps=8))
        assert len(out[0].token_ids) > 0
