"""The text_prose family: plain training-article text, denoised over its whole length."""

import re
from pathlib import Path

from dlm_backend.engine.checkpoint.tokenizer import Tokenizer as ChatTokenizer
from dlm_tiny import corpus
from dlm_tiny.prose_qa import MAX_PASSAGE_CHARS, ProseBank
from dlm_tiny.train import encode_examples

SHIPPED = Path(__file__).parents[3] / "dlm_backend" / "assets" / "dlm-tiny"


def test_text_prose_draws_bounded_runs_of_training_articles_only(bank):
    examples = corpus.generate(300, seed=0, families=["text_prose"], prose_bank=str(bank))
    held = {a.index for a in ProseBank(bank).articles.values() if a.held_out}
    assert held == {0, 10}
    drawn = set()
    for ex in examples:
        assert ex.messages == [] and 0 < len(ex.target) <= MAX_PASSAGE_CHARS
        drawn |= {int(n) for n in re.findall(r"Orvel(?:\D{0,9})(\d+)", ex.target)}
    assert drawn.isdisjoint(held) and len(drawn) == 18          # every training article, no held-out one
    assert sum(ex.target.startswith("Orvel story") for ex in examples) > 100   # titles about half the time
    assert sum("\n\n" in ex.target for ex in examples) > 100                   # runs of several paragraphs


def test_plain_text_is_encoded_after_one_eos_with_no_chat_turns(bank):
    chat = ChatTokenizer(SHIPPED)
    examples = corpus.generate(20, seed=1, families=["text_prose", "qa"], prose_bank=str(bank))
    pairs = encode_examples(examples, chat, 1024)
    eos = chat.token_id("<|endoftext|>")
    for ex, (prompt, reply) in zip(examples, pairs):
        if ex.family == "text_prose":
            assert prompt == [eos] and chat.decode(reply) == ex.target       # all of it is the reply
        else:
            assert "<|im_start|>" in chat.decode(prompt, skip_special_tokens=False)
