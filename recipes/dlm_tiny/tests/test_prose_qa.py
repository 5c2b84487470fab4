"""The qa_prose family: questions built by rule over real sentences answer with a span of the passage
(the ``bank`` fixture is in conftest.py)."""

import random

import pytest

from dlm_backend.errors import DLMError
from dlm_tiny import corpus
from dlm_tiny.open_qa import NOT_IN_CONTEXT
from dlm_tiny.prose_qa import ProseBank, accept, echo_question, prose_qa, spans


@pytest.mark.parametrize("sentence, span, question", [
    ("Sales at the retailer fell 4% over Christmas, hit by warm weather.", "4%",
     "Sales at the retailer fell what percentage over Christmas?"),
    ("Japan has $850bn in foreign exchange reserves.", "$850bn", "Japan has how much in foreign exchange reserves?"),
    ("British Airways has blamed high fuel prices for a drop in profits.", "British Airways",
     "Who has blamed high fuel prices for a drop in profits?"),
    ("The firm said it would cut 2,850 jobs as a result of falling profits.", "2,850 jobs",
     "The firm said it would cut how many jobs?"),   # "as ..." opens another clause
    ("The Orvel lighthouse was opened in 1974 by the harbour board.", "1974",
     "The Orvel lighthouse was opened when by the harbour board?"),
])
def test_echo_question_asks_where_the_answer_stands(sentence, span, question):
    assert span in spans(sentence)
    assert echo_question(sentence, span) == question


@pytest.mark.parametrize("sentence, span", [
    ("The US trade deficit is set to stabilise, the Federal Reserve head said.", "Federal Reserve"),  # a modifier
    ("Wales won the game 19-13 at the Millennium Stadium on Saturday.", "13"),                     # a score
    ("Yukos is claiming more than $20bn (£11bn) in damages from the state.", "£11bn"),             # an aside
])
def test_echo_question_refuses_spans_no_question_reads_well_around(sentence, span):
    assert echo_question(sentence, span) is None


def test_accept_keeps_a_rewrite_that_asks_the_same_thing():
    echo = "Mr Gates pledged how much of his own money to support the cause?"
    assert accept("How much did Mr Gates pledge to support the cause?\n", echo, "$750m") == \
        "How much did Mr Gates pledge to support the cause?"
    assert accept("Who pledged money to support the cause?", echo, "$750m") is None       # another question word
    assert accept("How much did Mr Gates pledge, $750m?", echo, "$750m") is None           # the answer given away
    assert accept("How much is it?", echo, "$750m") is None                                # the words dropped
    assert accept(echo, echo, "$750m") is None                                             # nothing new


def test_prose_qa_answers_with_a_span_of_its_passage(bank):
    train, held = ProseBank(bank), ProseBank(bank, held_out=True)
    assert {i["article"] for i in train.items}.isdisjoint({i["article"] for i in held.items})
    rng, refusals = random.Random(3), 0
    for _ in range(200):
        d = prose_qa(rng, train, unanswerable=0.3)
        prompt = " ".join(m["content"] for m in d["messages"])
        if d["target"] == NOT_IN_CONTEXT:
            refusals += 1
        else:
            assert d["target"] in prompt
    assert 20 < refusals < 100


@pytest.mark.parametrize("family", ["qa_prose", "text_prose"])
def test_a_prose_family_without_a_bank_names_the_flag(family):
    with pytest.raises(DLMError, match=f"{family}.*--prose-bank"):
        corpus.generate(5, seed=0, weights={family: 1.0})
