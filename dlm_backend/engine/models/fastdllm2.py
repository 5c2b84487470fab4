"""Fast-dLLM v2 (``Fast_dLLM_QwenForCausalLM``, NVlabs): Qwen2.5 turned into a block-diffusion model.

The layers are Qwen2.5's, which Dream's file already implements (q/k/v biases, GQA, full NeoX
rotary, untied head, the prediction for position i read at i - 1), so this family only adds what
its checkpoint says differently: the block (``bd_size``, 32 in the released 1.5B and 7B) and the
mask token, which the released config leaves out (the reference ``generate()`` takes it as an
argument, 151665, the tokenizer's ``|<MASK>|``). The block-causal decoding itself lives in
engine/requests/block_sequence.py and samplers/fastdllm2.py.
"""

from __future__ import annotations

from dataclasses import replace

from dlm_backend.engine.models.base import ModelArgs
from dlm_backend.engine.models.config_reader import MAX_POSITIONS, ConfigReader
from dlm_backend.engine.models.dream import DreamModel
from dlm_backend.errors import CheckpointError

BLOCK = 32              # the reference generate()'s block_size default (bd_size in the released configs)


class Fast_dLLM_QwenForCausalLM(DreamModel):  # noqa: N801 - the checkpoint's architectures name
    """Fast-dLLM v2 1.5B / 7B: Qwen2.5 layers decoded block-causally in blocks of ``bd_size``."""

    # The paper's parallel set-up: threshold 0.9 in sub-blocks of 8 with the block cache.
    sampling_defaults = {"sampler": "fastdllm2", "threshold": 0.9, "sub_block_length": 8, "cache": "dual"}

    @classmethod
    def args_from_config(cls, c: dict) -> ModelArgs:
        if c.get("use_sliding_window"):
            raise CheckpointError("config.json: use_sliding_window: true asks for sliding-window attention, which "
                                  "Fast-dLLM v2 does not use and this engine does not implement.")
        r = ConfigReader(c)
        args = super().args_from_config({k: v for k, v in c.items() if k != "mask_token_id"})
        vocab = args.vocab_size
        # The mask id: config.json (or config_overrides) when given, else the tokenizer's mask token.
        mask = r.int("mask_token_id", default=None, low=0, high=vocab - 1)
        return replace(args, mask_token_id=mask, block_size=r.int("bd_size", default=BLOCK, high=MAX_POSITIONS))
