"""The keyed families: answers are found only by reading both halves of the request (the subject
and the attribute, the verb and the noun), every target scores right, and the keys are open-ended."""

import json
import re

import pytest

from dlm_backend.chat.tool_calls import parse_tool_calls
from dlm_tiny import corpus
from dlm_tiny.evaluate import score
from dlm_tiny.open_key_tools import VERBS
from test_open_corpus import assert_grounded   # the recipe's conftest puts tests/ on the path

KEYED = ["qa_keyed", "tool_keyed", "json_keyed", "tool_result_keyed"]


@pytest.fixture(scope="module")
def examples():
    return corpus.generate(1200, seed=4, families=KEYED)


def _text(e) -> str:
    return " ".join(m["content"] for m in e.messages)


def test_every_target_scores_exact_and_the_corpus_is_seeded(examples):
    assert all(score(e, e.target)["exact"] for e in examples)
    assert [e.to_json() for e in corpus.generate(1200, seed=4, families=KEYED)] == [e.to_json() for e in examples]


def test_qa_answers_are_in_the_passage_and_distractors_share_half_the_key(examples):
    qa = [e for e in examples if e.family == "qa_keyed"]
    assert_grounded(qa, most_refused=1 / 4)
    # most passages hold values other than the answer, so copying any value is not enough
    crowded = [e for e in qa if _text(e).count(" is ") + _text(e).count(": ") > 2]
    assert len(crowded) > len(qa) / 2


def test_tool_calls_pick_the_task_among_tools_sharing_its_verb_or_noun(examples):
    calls = [e for e in examples if e.family == "tool_keyed" and not e.expected.get("no_call")]
    names, shared = set(), 0
    for e in calls:
        content, [call], bad = parse_tool_calls(e.target)
        assert not bad and not content
        offered = {t["function"]["name"]: t["function"] for t in e.tools}
        tool = offered[call["name"]]
        assert set(tool["parameters"]["required"]) == set(call["arguments"])
        for value in call["arguments"].values():
            assert str(value) in _text(e)
        names.add(call["name"])
        shared += len(offered) > 1
    assert len(names) > len(calls) * 0.6 and shared > len(calls) / 2


def test_the_verbs_name_distinct_tasks():
    words = [w for names, _, _ in VERBS.values() for w in names]
    assert len(words) == len(set(words))


def test_json_keys_are_the_texts_words_and_values_are_copied_typed(examples):
    rows = [e for e in examples if e.family == "json_keyed"]
    camel, extra = 0, 0
    for e in rows:
        text, obj = e.messages[-1]["content"].lower(), json.loads(e.target)
        for key, value in obj.items():
            words = re.sub(r"([A-Z])", r" \1", key).replace("_", " ").lower().split()
            if key not in ("name", "title", "subject"):
                assert all(w in text for w in words), (key, text)
            assert str(value).lower() in text, (value, text)
            assert isinstance(value, str) or "price" not in key or isinstance(value, (int, float))
        camel += any(k != k.lower() for k in obj)
        # the text states attributes the schema does not ask for, so copying every fact is wrong
        extra += text.count("\n") + text.count(". ") >= len(obj) + 1
    assert len(rows) == 300 and camel > 50 and extra > len(rows) / 3


def test_tool_results_state_the_asked_attributes_of_a_record_that_holds_more(examples):
    rows = [e for e in examples if e.family == "tool_result_keyed"]
    crowded = 0
    for e in rows:
        *_, asked, call, result = e.messages
        assert call["tool_calls"][0]["function"]["name"] in {t["function"]["name"] for t in e.tools}
        for value in e.expected["values"]:
            assert value in result["content"] and value in e.target
        crowded += result["content"].count(":") > len(e.expected["values"])
    assert len(rows) == 300 and crowded > len(rows) * 0.6
