"""Every knob of a dlm-tiny training run, with the measurement that set its default (findings.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    out_dir: str = "runs/dlm-tiny"
    seed: int = 0
    num_examples: int = 120000
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768
    max_len: int = 512             # a packed row; one example (3 tool schemas ~ 250 tokens) must fit
    rows: int = 12                 # packed rows per optimiser step (6144 tokens)
    # EOS run after each reply (1..this): the model learns to end a reply and fill its canvas. It also
    # learns canvas length as a cue for answer length: after 40, a 64-token canvas made p1 refuse
    # 64% of held-out QA questions ("The context does not say.", the longest QA answer); a 700-step
    # stage at 160 (p2) took QA from 36% to 88% (findings.md, the p-run).
    max_extra_pad: int = 40
    # "uniform" (every committed stage up to s6) or "log" (objective.PackedBatches): one stage at 256
    # "log" sees every canvas length for about the EOS cost of "uniform" at 90, so a from-scratch run
    # needs no separate stages that lengthen the run (p2, p3).
    pad_dist: str = "uniform"
    pad_weight: float = 0.05       # loss weight of that EOS run relative to the reply's tokens
    steps: int = 1700             # run 6: 43 min on 2 cores (findings.md)
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 150
    weight_decay: float = 0.01
    # t ~ U(t_min, 1). With t ~ U(0.001, 1) and weights 1/t the lightly-masked rows dominate the loss,
    # and those are solved from the reply's own unmasked tokens: run 2 at step 2250 wrote fluent
    # fragments that ignored the prompt (0/42 held-out); heavily-masked rows need the prompt.
    t_min: float = 0.2
    prompt_mask_prob: float = 0.1  # examples masked over their whole length (see objective.py)
    # Share of examples trained autoregressively: 1 at step 0, falling linearly to 0 at this
    # fraction of the run (objective.diffusion_loss says why); the rest of the run is pure diffusion.
    ar_until: float = 0.6
    save_every: int = 250
    init_from: str = ""            # a finished dlm-tiny folder to continue from (its tokenizer too)
    # Training mix for a stage: "qa=0.35,list=0.12" overrides those families' corpus weights, and
    # ``unanswerable`` is the share of QA questions answered "The context does not say." (0.15 in the
    # held-out set). p2 refused only 3 of the 23 unanswerable questions in 200 held-out QA prompts;
    # a stage with qa=0.35 and unanswerable 0.3 (p4) refused 3 too. Once the model binds values to
    # people (s5, 38/43 distractors), a stage at 0.35 (s6) took refusals from 2 to 9 of 23 (findings.md).
    family_weights: str = ""
    unanswerable: float = 0.15
    # Share of QA contexts where another person has the asked attribute too. p3 answers those 20/43
    # (chance) and unique-attribute ones 134/134: it learned the attribute, not the person. A 600-step
    # stage at 0.7 (p5) reached 24/43, so the binding needs it from the first stage.
    qa_hard: float = 0.0
    # Share of QA prompts written as LlamaIndex and LangChain send them (rag_templates.py): y4 refused
    # LlamaIndex's query prompt though the answer was in it.
    rag_templates: float = 0.0
    # The question bank of the qa_prose family (prose_qa.py): news passages, a teacher's questions;
    # text_prose (prose_text.py) denoises the same bank's training articles.
    prose_bank: str = ""
    # Start layers 0-1 with a built induction circuit (circuits.py says why): on the induction task
    # copy loss falls 8.3 -> 1.0 in 100 steps with it and stays at chance for 800 without. It stays
    # frozen; a stage started with --init-from must use the first stage's setting.
    copy_circuit: bool = True
    copy_gain: float = 3.0
    # Bigram match dims (circuits.py): after a space or digit, which precede most prompt tokens, a
    # one-token match copies any of them; matching the token before too took causal copy accuracy
    # on space-separated text from 0.46 to 0.73 before training (tests/test_circuits.py).
    # 0 (with --rope-theta 1e4) is the one-token circuit of runs c5-c8.
    copy_prev_dims: int = 16
    # The bigram half of the match sits on rotary pairs 11-18; at theta 1e4 they turn so fast that it
    # helped only within ~100 tokens (copy accuracy 0.72 against 0.57 one-token) and hurt beyond
    # (0.22-0.44 against 0.36-0.53). At 1e6 (Qwen2.5's value): 0.90 within 100, 0.81 at 100-200.
    # A stage started with --init-from keeps its first stage's theta.
    rope_theta: float = 1e6
    # A deep head that copies a token from where it learns to look (pointer.py says why: the first
    # piece of a JSON value or tool argument follows '"', which the bigram copy cannot match).
    # 0: none (runs up to b2). Needs the copy circuit; --init-from stages must pass their first value.
    pointer_layer: int = 4
    # "float32" or "bf16": matrix products in bfloat16 under autocast, weights, optimiser and loss in
    # float32. Only for CPUs with native bf16 (AVX512-BF16, AMX): there 256x768 products ran at 420
    # GFLOP/s against 180 in float32; without it bf16 is emulated and far slower, so it is refused.
    precision: str = "float32"
    # Where the products run: "cpu", or "cuda" / "cuda:N" when a GPU is lent. Masks come from the same
    # CPU generator either way, so a run's batches and masks do not depend on the device.
    device: str = "cpu"
    # Compile each layer's dense parts with torch.compile (compiled.py): 1.18x a bf16 step on 2 cores,
    # for about 10 s of compiling at the start. Same objective; roundings differ from an eager run.
    compile: bool = False
    # 0: the Dream layout, every position sees the whole sequence. N: the block layout
    # (block_layout.py), a Fast-dLLM v2 checkpoint decoded in blocks of N; a stage may convert a
    # Dream-layout checkpoint with --init-from. It takes --prompt-mask-prob 0 and --ar-until 0.
    # From m1 at 8 (d1, d2): 73.0-76.1% held-out at a sixth of the Dream layout's serving time, the
    # hand-written set unmoved, and the QA distractor binding lost (97.7 -> 37-42%; findings.md).
    block_size: int = 0
