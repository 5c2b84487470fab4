"""Plain-text denoising over the news articles: the ``text_prose`` family.

Every other family is a conversation whose reply is a few tokens after a long prompt, so the model
reads English prompts but is only ever asked to write short answers, tool calls and JSON. LLaDA and
Dream learn English by denoising plain text first; this family gives dlm-tiny a share of that: a
run of paragraphs from a training article, masked over its whole length at the usual ratio
t ~ U(0.2, 1) (objective.py), with no chat turns around it. Held-out articles are never drawn, so
``qa_prose``'s held-out questions stay unseen.
"""

from __future__ import annotations

import random

from dlm_tiny.prose_qa import MAX_PASSAGE_CHARS, ProseBank


def prose_text(rng: random.Random, bank: ProseBank) -> str:
    """Consecutive paragraphs of one training article (its title first, 1 time in 2), from a random
    paragraph on, stopping before :data:`MAX_PASSAGE_CHARS` (the QA passages' bound: ~510 tokens)."""
    article = rng.choice(bank.training_articles)
    at = rng.randrange(len(article.paragraphs))
    parts = [article.title] if rng.random() < 0.5 else []
    for para in article.paragraphs[at:]:
        if parts and sum(len(p) + 2 for p in parts) + len(para) > MAX_PASSAGE_CHARS:
            break
        parts.append(para)
    return "\n\n".join(parts)[:MAX_PASSAGE_CHARS]
