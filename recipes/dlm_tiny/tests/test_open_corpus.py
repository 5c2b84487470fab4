"""The open-ended families: every reply is right by the evaluation's own scorer, every call fits its
tool's schema and copies what the request said, and older corpora are unchanged by their existence."""

import hashlib
import json
import random

import pytest

from dlm_backend.chat.tool_calls import parse_tool_calls
from dlm_tiny import corpus
from dlm_tiny.entities import Entities
from dlm_tiny.evaluate import score
from dlm_tiny.open_qa import NOT_IN_CONTEXT, RELATIONS
from dlm_tiny.open_tool_frames import FRAMES
from dlm_tiny.open_tools import open_tool_call, open_tool_result

OPEN = ["qa_open", "tool_open", "tool_result_open", "json_open", "chat_open"]


def assert_grounded(qa: list, most_refused: float) -> None:
    """Each QA example's answer is in its prompt or is the refusal, and refusals are some but at most
    ``most_refused`` of them (so refusing is never the cheap answer to learn)."""
    refused = [e for e in qa if e.target == NOT_IN_CONTEXT]
    assert 0 < len(refused) < len(qa) * most_refused
    for e in qa:
        assert e.target == NOT_IN_CONTEXT or e.target in " ".join(m["content"] for m in e.messages)


@pytest.fixture(scope="module")
def examples():
    return corpus.generate(1500, seed=3, families=OPEN)


def test_every_target_scores_exact_and_the_corpus_is_seeded(examples):
    assert all(score(e, e.target)["exact"] for e in examples)
    again = corpus.generate(1500, seed=3, families=OPEN)
    assert [e.to_json() for e in again] == [e.to_json() for e in examples]


def test_a_call_uses_an_offered_tool_with_its_parameter_names_and_the_requests_values(examples):
    calls = [e for e in examples if e.family == "tool_open" and not e.expected.get("no_call")]
    assert len(calls) > 200
    names = set()
    for e in calls:
        content, [call], bad = parse_tool_calls(e.target)
        tool = next(t["function"] for t in e.tools if t["function"]["name"] == call["name"])
        params = tool["parameters"]
        assert not bad and not content and set(call["arguments"]) <= set(params["properties"])
        assert set(params["required"]) <= set(call["arguments"])
        request = " ".join(m["content"] for m in e.messages if m["role"] == "user")
        for value in call["arguments"].values():
            if not isinstance(value, bool):          # "turn off" gives on=false with no slot
                assert str(value) in request, (value, request)
        names.add(call["name"])
    assert len(names) > 150        # tools are named afresh, not drawn from a catalogue


def test_offered_tool_names_are_distinct_and_no_call_turns_exist(examples):
    tools = [e for e in examples if e.family == "tool_open"]
    assert all(len({t["function"]["name"] for t in e.tools}) == len(e.tools) for e in tools)
    assert 0 < sum(bool(e.expected.get("no_call")) for e in tools) < len(tools) / 4


def test_tool_results_answer_only_from_the_conversation():
    rng = random.Random(0)
    ent = Entities(rng, "train")
    for _ in range(400):
        d = open_tool_result(rng, ent)
        text = json.dumps(d["messages"])
        words = [w.strip(".,:\"'") for w in d["target"].split()]
        # each number in the answer appears in the conversation (request or tool result)
        assert all(w in text for w in words if any(c.isdigit() for c in w)), (d["target"], text)


def test_every_frame_can_be_called_and_answered():
    rng = random.Random(1)
    ent = Entities(rng, "train")
    seen = set()
    for _ in range(3000):
        d = open_tool_call(rng, ent)
        if "name" in d["expected"]:
            seen.add(d["target"].split('"arguments"')[0])
        open_tool_result(rng, ent)
    assert len(FRAMES) >= 20 and len(seen) > len(FRAMES)


def test_qa_answers_are_in_the_passage_or_refused(examples):
    assert_grounded([e for e in examples if e.family == "qa_open"], most_refused=1 / 3)
    assert len(RELATIONS) >= 30


def test_json_targets_match_their_schema_and_text(examples):
    for e in (e for e in examples if e.family == "json_open"):
        obj = json.loads(e.target)
        assert list(obj) == list(e.expected["schema"]["properties"])
        text = " ".join(m["content"] for m in e.messages)
        assert all(str(v) in text for v in obj.values() if not isinstance(v, bool))


def test_older_corpora_draw_what_they_drew_before():
    """The open families weigh 0 unless named, so train.sh's first four stages (and the shipped
    model they reproduce) draw the corpus they drew before: this digest is stage 4's mix as the
    corpus wrote it before the open families existed."""
    digest = hashlib.sha256()
    for e in corpus.generate(300, seed=0, weights={"tool_call": 0.35, "copy": 0.05}, unanswerable=0.35,
                             qa_hard=0.7, rag_templates=0.3):
        digest.update(json.dumps(e.to_json(), sort_keys=True).encode())
    assert digest.hexdigest() == "7719db92b044dcfb3b43eb9773af01c2fab7e2477c848170dd640fe0dae68d80"
    later = list(corpus.FAMILIES)[list(corpus.FAMILIES).index("copy") + 1:]
    assert later == OPEN + ["qa_keyed", "tool_keyed", "json_keyed", "tool_result_keyed", "qa_prose",
                            "text_prose"] and all(corpus.FAMILIES[f] == 0 for f in later)
