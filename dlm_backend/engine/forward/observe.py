"""What a pass shows beyond its commits, gathered only for the requests that ask: the log-probability
of each committed token at the pass that committed it (``logprobs``), and the active window of the
canvas after the pass with the model's current draft for its masked slots (``stream_canvas``).

A diffusion pass scores every candidate slot at once, so a token's log-probability is read where
SGLang's dLLM path reads it: the log-softmax (float32, raw logits) of the token at the pass that
commits it; a slot committed again (an editing sampler, a self-speculation verify) keeps its last
one. Only the committed rows are gathered: nothing ``[N, V]`` outlives the pass.
"""

from __future__ import annotations

import torch

from dlm_backend.engine.outputs import CanvasFrame, TokenLogprob
from dlm_backend.engine.requests.sequence import Pass, Sequence


def logprobs_of(logits: torch.Tensor, rows: list[int], tokens: list[int], top: int) -> list[TokenLogprob]:
    """Each ``tokens[i]``'s log-probability under ``logits[rows[i]]`` ([n, V]) and the ``top`` likeliest."""
    if not rows:
        return []
    lp = torch.log_softmax(logits[rows].float(), dim=-1)                      # [k, V], k committed rows
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    if top:
        values, ids = lp.topk(top, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [[] for _ in rows]
    return [TokenLogprob(t, c, alt) for t, c, alt in zip(tokens, chosen, tops)]


def observe_denoise(seq: Sequence, step: Pass, logits: torch.Tensor | None, commit,
                    draft: torch.Tensor | None) -> tuple[list[int], dict[int, int]]:
    """Record a denoise pass's logprobs on ``seq``; returns what :func:`frame_after` shows of it: the
    positions it commits and, per still-masked candidate, the model's token (``draft``: one per
    candidate row, None when no frame is wanted)."""
    picked = [step.candidates[i] for i in commit.indices]
    if seq.params.logprobs is not None and logits is not None:
        seq.note_logprobs(picked, logprobs_of(logits, commit.indices, commit.token_ids, seq.params.logprobs))
    proposed = {}
    if draft is not None:
        masked = step.masked or [True] * len(step.candidates)
        proposed = {p: t for p, t, m in zip(step.candidates, draft.tolist(), masked) if m}
    return picked, proposed


def observe_cache(seq: Sequence, step: Pass, logits: torch.Tensor, tokens: list[int]) -> None:
    """Record the logprobs of the tokens a causal pass predicts (written where its slots are masked)."""
    if seq.params.logprobs is not None and tokens:
        seq.note_logprobs(step.candidates, logprobs_of(logits, list(range(len(tokens))), tokens,
                                                       seq.params.logprobs))


def frame_after(seq: Sequence, step: Pass, picked: list[int], proposed: dict[int, int]) -> CanvasFrame:
    """The pass's window of the output after it ran: committed ids (None where still masked), the draft
    for the masked slots, and which slots this pass committed (indices into the output)."""
    P = seq.prompt_len
    start, end = max(step.start, P), min(step.end, len(seq.canvas))
    tokens = [None if seq.canvas[p] == seq.mask_id else seq.canvas[p] for p in range(start, end)]
    draft = [proposed.get(p) if tokens[p - start] is None else None for p in range(start, end)]
    return CanvasFrame(pass_index=seq.num_forward_passes, start=start - P, token_ids=tokens, draft_ids=draft,
                       committed=sorted(p - P for p in picked if start <= p < end))
