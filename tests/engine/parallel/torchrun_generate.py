"""Run under torchrun by test_torchrun.py: every rank builds ``LLM(..., tensor_parallel_size=
WORLD_SIZE)``; rank 0 generates and prints the tokens as JSON, the others serve as workers inside the
call and leave when rank 0 closes."""

import json
import sys

from dlm_backend import LLM

folder, world = sys.argv[1], int(sys.argv[2])
llm = LLM(folder, device="cpu", dtype="float32", tensor_parallel_size=world)
params = llm.sampling_params(temperature=0.0, ignore_eos=True, max_tokens=12)
outs = llm.generate(prompt_token_ids=[[5, 6, 7, 8, 9], [20, 21, 22]], sampling_params=params)
print("TOKENS " + json.dumps([o.token_ids for o in outs]), flush=True)
llm.close()
