"""dlm-tiny's checkpoint files other than the weights: the tokenizer trained on the corpus, the
Dream-layout ``config.json``, and the hub-shaped folder (generation and tokenizer configs with the
chat template), so the shipped model loads through the same path as the 8B checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from dlm_backend.engine.sampling_defaults import CHECKPOINT_DEFAULTS_KEY, checkpoint_defaults
from dlm_tiny.template import CHAT_TEMPLATE, EOS, MASK, SPECIAL_TOKENS, TOOL_TOKENS

if TYPE_CHECKING:
    from dlm_tiny.train_config import TrainConfig


def build_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on the corpus; special tokens first (ids 0..3), tool tags after."""
    tok = Tokenizer(models.BPE())
    # Spaces are tokens of their own and digits single tokens, so a name or number tokenizes the
    # same wherever it stands. GPT-2-style pieces (" Kre" after a space, "K" + "re" after a quote)
    # made copying a word from the prompt into a tool call or JSON value a per-token mapping to
    # learn instead of an identity: run 2 and the first 1750 steps of run 5 copied 0/20 unseen names.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TOOL_TOKENS), special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def model_config(cfg: TrainConfig, tok: Tokenizer) -> dict:
    """config.json: a Dream checkpoint, or with ``--block-size`` a Fast-dLLM v2 one (the same layers)."""
    eos = tok.token_to_id(EOS)
    family = ({"architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen", "bd_size": cfg.block_size}
              if cfg.block_size else {"architectures": ["DreamModel"], "model_type": "Dream"})
    return {
        **family, "hidden_act": "silu",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": 2048, "rope_theta": cfg.rope_theta, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "mask_token_id": tok.token_to_id(MASK), "eos_token_id": eos,
        "pad_token_id": eos, "bos_token_id": None, "torch_dtype": "float32", "use_cache": False,
    }


#: How dlm-tiny decodes unless the caller says otherwise (``generation_config.json``'s
#: ``dlm_sampling``). Chosen on p3, held-out, 200 a family, with the prefix cache: the threshold
#: rule at 0.95 and block 4 scores 69.6% exact and 96.8% valid at 0.558 forward passes per token,
#: against `llada` one token per pass at block 32 (69.0%, 98.5%, 2.134); at block 8 68.8% and
#: 93.8%, and 0.9 at block 4 68.7% and 93.5%. At the adapters' usual block of 32 (dual) 0.9 falls
#: to 60.1%: each pass leaves more masked neighbours to commit wrongly together (``"Tarnholroum"``).
#: On s6 the default was 73.4% and 97.8% at 0.519 passes per token (``llada`` 72.8%, 99.5%); on the
#: shipped y6r it is 76.4% and 99.0% at 0.453 (``llada`` 76.2%, 99.2% at 2.171; findings.md).
SAMPLING_DEFAULTS = {"sampler": "threshold", "threshold": 0.95, "block_length": 4, "cache": "prefix"}
#: The block layout's decoding (``--block-size``): Fast-dLLM v2's own parallel setting, its sampler
#: at 0.9 in sub-blocks of 8 in the checkpoint's blocks. On d2 (findings.md), 200 a family: 73.6% at
#: 0.299 passes + 0.194 cache passes a token, against 74.4% one token a pass (1.049 + 0.193); 0.95 in
#: sub-blocks of 4 scored 76.1% at 0.429 + 0.191. On the hand-written set this and one token a pass
#: both scored 18.4%.
BLOCK_SAMPLING_DEFAULTS = {"sampler": "fastdllm2", "threshold": 0.9, "sub_block_length": 8, "cache": "dual"}


def write_checkpoint_files(folder: Path, config: dict, tok: Tokenizer) -> None:
    """Everything but the weights, laid out exactly as a hub checkpoint. The decoding defaults go
    through the engine's own reader first, so a checkpoint the engine would refuse is never written."""
    name = "BLOCK_SAMPLING_DEFAULTS" if config.get("bd_size") else "SAMPLING_DEFAULTS"
    defaults = BLOCK_SAMPLING_DEFAULTS if config.get("bd_size") else SAMPLING_DEFAULTS
    generation = {"eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"],
                  "mask_token_id": config["mask_token_id"], CHECKPOINT_DEFAULTS_KEY: defaults}
    checkpoint_defaults(generation, f"dlm_tiny.checkpoint.{name}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": EOS, "pad_token": EOS, "mask_token": MASK, "model_max_length": 2048,
         "chat_template": CHAT_TEMPLATE}, indent=2))
