"""Fast-dLLM v2's published ``generate`` (NVlabs; ``Fast_dLLM_QwenForCausalLM.generate``).

A block of ``L`` slots is decoded in sub-blocks of ``sub_block_length`` (default 8), left to
right. Each pass draws a token for every slot of the current sub-block and commits the masked
slots whose confidence is strictly above ``threshold``, plus always the most confident masked one
(``threshold=1`` is one token a pass). The model reads slot i's prediction at i - 1 (the block's
first slot at itself), and a block's first slot is the argmax of the pass that cached the block
before it, autoregressively. With ``cache="dual"`` (the reference's ``use_block_cache``) a pass
whose sub-block starts with a committed slot feeds only the sub-block and reads the rest of the
block's keys and values as the block's last full pass left them.

The reference generates ``max_new_tokens // L`` blocks after the prompt's block and then the next
block's autoregressive first token; ``dlm parity`` asks for exactly that many tokens. Its eval
sampler (``v2/generation_functions.py:batch_sample``) decodes a batch's rows together, so one row's
passes depend on the others'; requests joined into one batch (engine/requests/block_sequence.py,
``BatchSample``) are decoded that way, with this sampler deciding each row's commits.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.samplers.base import Commit, Sampler, StepInput
from dlm_backend.engine.samplers.blockwise import draw

SUB_BLOCK = 8           # the reference generate()'s small_block_size default


class FastDLLM2Sampler(Sampler):
    name = "fastdllm2"
    schedules = ("block",)              # Fast-dLLM v2's generate: block diffusion
    whole_sub_block = True
    ar_first_token = True

    def sub_block(self, params: SamplingParams) -> int:
        return min(params.sub_block_length or SUB_BLOCK, params.block_length)

    def step(self, inp: StepInput) -> Commit:
        token, confidence = draw(inp)
        masked = torch.tensor(inp.masked, dtype=torch.bool)
        confidence = confidence.masked_fill(~masked, -torch.inf)
        chosen = confidence > inp.params.threshold
        chosen[confidence.argmax()] = True                # the first most confident on ties
        picked = (chosen & masked).nonzero()[:, 0].tolist()
        return Commit(picked, token[picked].tolist())
