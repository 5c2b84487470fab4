"""Tiny checkpoints for tests: the parity weights plus a real tokenizer and chat template."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

FIXTURES = Path(__file__).parent / "fixtures"
# The shipped dlm-tiny gets tool calls right (96.5% held-out) but sums and list answers rarely
# (recipes/dlm_tiny/findings.md); the tests of those answers carry these marks (strict, as every xfail of the suite: an
# XPASS fails, so a model that gets them right says so).
WEAK_AT_LISTS = pytest.mark.xfail(
    reason="model capability: dlm-tiny gets list answers (sort, reverse, count) wrong most of the time "
           "(held-out, 200 per family, llada: lists 23.5%; recipes/dlm_tiny/findings.md)")
WEAK_AT_ARITHMETIC = pytest.mark.xfail(
    reason="model capability: dlm-tiny rarely adds right (held-out, 200 per family, llada: arithmetic "
           "24.0%; recipes/dlm_tiny/findings.md); it writes 52 for 12 + 30 (p3, an earlier shipped model, "
           "wrote 42 at its own defaults and XPASSed)")
PARITY = FIXTURES / "parity"

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Name three prime numbers: two, three and five.",
    "Diffusion language models fill masked tokens in parallel.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "What is the weather in Tokyo today? It is sunny and warm.",
    "1 2 3 4 5 6 7 8 9 10 11 12 + - * / = ( ) { } [ ] : , \" '",
] * 20

CHATML = (
    "{% if tools %}<|im_start|>system\nYou can call tools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% elif messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SPECIALS = {
    # family: ids 300.. in order; 300 is the checkpoint's mask id, 301 its EOS.
    "dream": ["<|mask|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "llada": ["<|mdm_mask|>", "<|endoftext|>", "<|startoftext|>", "<|eot_id|>",
              "<|start_header_id|>", "<|end_header_id|>"],
}


def build_tokenizer(family: str | None) -> Tokenizer:
    """300 byte-level BPE tokens trained on CORPUS, then the family's special tokens from id 300."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() == 300, tok.get_vocab_size()
    if family is not None:
        tok.add_special_tokens(SPECIALS[family])
    return tok


def make_chat_checkpoint(dest: Path, family: str, **config_overrides) -> Path:
    """Copy the parity checkpoint of ``family`` and give it a tokenizer and chat template."""
    src = PARITY / f"{family}-tiny"
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "generation_config.json"):
        shutil.copy(src / name, dest / name)
    config = json.loads((src / "config.json").read_text())
    config.update(config_overrides)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    build_tokenizer(family).save(str(dest / "tokenizer.json"))
    specials = SPECIALS[family]
    tok_config = {
        "eos_token": specials[1],
        "pad_token": specials[1],
        "mask_token": specials[0],
        "bos_token": specials[2] if family == "llada" else None,
        "chat_template": CHATML if family == "dream" else LLAMA3,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return dest


# The Ling-2.0 chat format LLaDA2 uses (roles in <role> tags, turns closed by <|role_end|>, tools in
# <tools>, results as OBSERVATION turns), written for these tests from its published description.
LING = (
    "{% set roles = {'system': 'SYSTEM', 'user': 'HUMAN', 'assistant': 'ASSISTANT', 'tool': 'OBSERVATION'} %}"
    "{% if tools %}<role>SYSTEM</role>You can call tools:\n<tools>\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}</tools><|role_end|>{% endif %}"
    "{% for m in messages %}<role>{{ roles[m['role']] }}</role>"
    "{% if m['role'] == 'tool' %}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% else %}{{ m['content'] or '' }}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|role_end|>{% endfor %}"
    "{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
)
# A Gemma-style chat format for DiffusionGemma, written for these tests: turns are
# <start_of_turn>{user|model|system}\n ... <end_of_turn>\n after <bos>. Neither the notes nor the
# reference code give DiffusionGemma's tool format, so tools follow the Hermes form the chat layer
# parses: schemas in the system turn, calls as <tool_call>{json}</tool_call>, results in a user turn
# inside <tool_response>.
GEMMA = (
    "{{ bos_token }}{% if tools %}<start_of_turn>system\nYou can call tools:\n{% for t in tools %}{{ t | tojson }}"
    "\n{% endfor %}<end_of_turn>\n{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ {'assistant': 'model', 'tool': 'user'}.get(m['role'], m['role']) }}\n"
    "{% if m['role'] == 'tool' %}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% else %}{{ m['content'] or '' }}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# A Mistral-style chat format for Nemotron-Labs-Diffusion, written for these tests ([INST] turns after
# <s>; tools as Hermes <tool_call> blocks, the one format the chat layer writes and reads).
MISTRAL = (
    "{{ bos_token }}{% if tools %}[SYSTEM_PROMPT]You can call tools:\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}[/SYSTEM_PROMPT]{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}{{ eos_token }}"
    "{% elif m['role'] == 'system' %}[SYSTEM_PROMPT]{{ m['content'] }}[/SYSTEM_PROMPT]"
    "{% elif m['role'] == 'tool' %}[INST]<tool_response>\n{{ m['content'] }}\n</tool_response>[/INST]"
    "{% else %}[INST]{{ m['content'] }}[/INST]{% endif %}{% endfor %}"
)
#: Gemma's special tokens at the ids its tokenizer gives them (the fixture's config: pad 0, eos 1,
#: bos 2; generation_config's second EOS, 106, is <end_of_turn>)
GEMMA_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 105: "<start_of_turn>", 106: "<end_of_turn>"}


def build_gemma_tokenizer() -> Tokenizer:
    """Byte-level BPE over CORPUS after 107 special tokens at Gemma's ids (0..106), 407 in all."""
    specials = [GEMMA_SPECIALS.get(i, f"<unused{i}>") for i in range(107)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=107 + 300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


#: block family -> (parity-block checkpoint, {id: special token}, chat template, tokenizer_config names)
BLOCK_FAMILIES = {
    "llada2": ("llada2-tiny", {490: "<|startoftext|>", 491: "<|endoftext|>", 492: "<role>", 493: "</role>",
                               494: "<|mask|>", 495: "<|role_end|>"}, LING,
               {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "mask_token": "<|mask|>"}),
    "sdar": ("sdar-tiny", {472: "<|endoftext|>", 473: "<|im_start|>", 474: "<|im_end|>", 498: "<|MASK|>"}, CHATML,
             {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": "<|MASK|>"}),
    "fastdllm2": ("fastdllm2-tiny", {478: "<|endoftext|>", 479: "<|im_start|>", 480: "<|im_end|>", 500: "|<MASK>|"},
                  CHATML, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": "|<MASK>|"}),
    "wedlm": ("wedlm-tiny", {300: "<|MASK|>", 301: "<|endoftext|>", 302: "<|im_start|>", 303: "<|im_end|>"}, CHATML,
              {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": "<|MASK|>"}),
    "nemotron": ("nemotron-labs-tiny", {310: "<mask>", 311: "</s>", 312: "<s>", 313: "<pad>", 314: "[INST]",
                                        315: "[/INST]", 316: "[SYSTEM_PROMPT]", 317: "[/SYSTEM_PROMPT]"}, MISTRAL,
                 {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "mask_token": "<mask>"}),
    "diffusiongemma": ("diffusiongemma-tiny", GEMMA_SPECIALS, GEMMA,
                       {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
}


def make_block_chat_checkpoint(dest: Path, family: str) -> Path:
    """A block-diffusion parity checkpoint with a tokenizer whose special tokens sit at the ids its
    config uses (the mask id of LLaDA2 and Fast-dLLM v2 comes from the tokenizer) and a chat template."""
    name, specials, template, names = BLOCK_FAMILIES[family]
    src = FIXTURES / "parity-block" / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("model.safetensors", "generation_config.json", "config.json"):
        shutil.copy(src / f, dest / f)
    if family == "diffusiongemma":
        tok = build_gemma_tokenizer()
    else:
        tok = build_tokenizer(None)
        tok.add_special_tokens([specials.get(i, f"<|reserved_{i}|>") for i in range(300, max(specials) + 1)])
    for i, t in specials.items():
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({**names, "chat_template": template}, indent=2))
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app):
    """Run a FastAPI app with uvicorn on a free loopback port; yields its base URL."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(400):
        if srv.started:
            break
        time.sleep(0.025)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def parity_cases(name: str):
    """The reference sampler cases of one parity checkpoint, as pytest params ``(name, case)``."""
    import pytest

    data = json.loads((PARITY / name / "cases.json").read_text())
    return [pytest.param(name, c, id=f"{name}-{i}-{c['sampler']}") for i, c in enumerate(data["cases"])]


def parity_params(case: dict):
    """The SamplingParams that reproduce a parity case's reference sampler call (``dlm parity``'s mapping)."""
    from dlm_backend.parity.cases import SAMPLERS

    return SAMPLERS[case["sampler"]](case, {}).params[0]


def forward(model, ids, triton: bool = False):
    """Hidden states of one whole sequence ``ids`` (bidirectional, positions 0..), as the runner
    computes them; and the logits of every row."""
    import torch

    from dlm_backend.engine.layers import ForwardContext, PackedAttention, Segment, forward_context

    pos = torch.arange(len(ids), device=ids.device)
    with forward_context(ForwardContext(PackedAttention([Segment(slice(0, len(ids)), 0)]), triton)):
        hidden = model(ids, pos)
        return hidden, model.compute_logits(hidden)


def run_to_end(engine) -> dict:
    """Step ``engine`` until idle; the final chunk of every request, by request id."""
    chunks = []
    while engine.has_unfinished:
        chunks += engine.step()
    return {c.request_id: c for c in chunks if c.finished}


def with_template(folder, dream_chat, template=None):
    """A checkpoint folder with dream_chat's tokenizer and the given chat template (or none)."""
    from dlm_backend.engine.checkpoint.tokenizer import Tokenizer as CheckpointTokenizer

    (folder / "tokenizer.json").write_bytes((dream_chat / "tokenizer.json").read_bytes())
    if template is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return CheckpointTokenizer(folder)


def copy_fixture(tmp_path: Path, name: str = "llada-tiny") -> Path:
    """A parity fixture copied into ``tmp_path``, for a test that edits or breaks its files."""
    return Path(shutil.copytree(PARITY / name, tmp_path / name))


def engine_for(path):
    """An engine of its own (not the process's shared one) on the checkpoint at ``path``."""
    from dlm_backend.engine.engine import LLMEngine
    from dlm_backend.engine.engine_config import EngineConfig

    return LLMEngine(EngineConfig(model=str(path)))
