"""The hand-written evaluation set: its file's shape, and its scorer on hand-made right and wrong replies."""

import json
import re
from dataclasses import replace

import pytest

from dlm_backend.chat.tool_calls import call_text
from dlm_tiny.handwritten import (MINIMUM, evaluate, format_table, groups, has_phrase, is_refusal, load, normalize,
                                  score)
from dlm_tiny.train import train
from test_train import TINY

ITEMS = load()


def tool(name, properties, required=()):
    return {"type": "function", "function": {"name": name, "description": "", "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


CURRENCY = tool("convert_currency", {"amount": {"type": "number"}, "from_currency": {"type": "string"},
                                     "to_currency": {"type": "string"}, "note": {"type": "string"},
                                     "tags": {"type": "array"}, "round": {"type": "boolean"}})
SEARCH = tool("web_search", {"query": {"type": "string"}})


def item(category, expected, tools=None):
    out = {"id": "x", "category": category, "style": "test", "messages": [{"role": "user", "content": "?"}],
           "expected": expected}
    return {**out, "tools": tools} if tools else out


def right_reply(it):
    """A reply the spec must accept, made from the spec itself."""
    e = it["expected"]
    if it["category"] == "tool_call":
        args = dict(e["arguments"])
        for k, v in e.get("alternatives", {}).items():
            args.setdefault(k, v[0])
        for k, v in e.get("contains", {}).items():
            args.setdefault(k, f"something about {v}")
        return call_text(e["name"], args)
    if it["category"] == "json":
        return json.dumps(e["object"], ensure_ascii=False)
    if e.get("refuse"):
        return "The context does not say."
    return " and ".join([e["answers"][0]] + [g[0] for g in e.get("also", [])]) + "."


# -- the file --------------------------------------------------------------------------------------

def test_the_set_has_its_minimum_per_category_and_unique_ids():
    counts = {c: sum(i["category"] == c for i in ITEMS) for c in MINIMUM}
    assert all(counts[c] >= n for c, n in MINIMUM.items()), counts
    assert len(ITEMS) >= 150 and len({i["id"] for i in ITEMS}) == len(ITEMS)
    qa = [i for i in ITEMS if i["category"] == "qa"]
    refuse = sum(bool(i["expected"].get("refuse")) for i in qa)
    assert 0.08 <= refuse / len(qa) <= 0.2             # about a tenth have no answer in the context


def test_every_item_is_well_formed_and_its_spec_accepts_a_right_reply():
    for it in ITEMS:
        assert set(it) <= {"id", "category", "style", "messages", "tools", "expected"}, it["id"]
        assert score(it, right_reply(it))["correct"], it["id"]
        if it["category"] == "tool_call":
            assert 1 <= len(it["tools"]) <= 4, it["id"]
            assert not score(it, "I can't do that.")["correct"]
        elif it["category"] == "qa" and not it["expected"].get("refuse"):
            assert not score(it, "I don't know.")["correct"], it["id"]


def test_tool_schemas_come_in_the_frameworks_shapes():
    tools = {t["function"]["name"]: t["function"] for i in ITEMS for t in i.get("tools", [])}
    assert len(tools) >= 25
    assert any(re.search(r"[a-z][A-Z]", name) for name in tools)                       # camelCase
    titled = [f for f in tools.values() if all("title" in p for p in f["parameters"]["properties"].values())]
    assert any(re.match(rf"{f['name']}\(", f["description"]) for f in titled)            # LlamaIndex FunctionTool
    kinds = {p.get("type") for f in tools.values() for p in f["parameters"]["properties"].values()}
    assert {"string", "integer", "number", "boolean", "array"} <= kinds
    assert any("enum" in p for f in tools.values() for p in f["parameters"]["properties"].values())


def test_the_framework_prompts_are_the_frameworks_own_text():
    pytest.importorskip("llama_index.core")
    from llama_index.core.chat_engine.context import DEFAULT_CONTEXT_TEMPLATE
    from llama_index.core.prompts.chat_prompts import TEXT_QA_SYSTEM_PROMPT
    from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT_TMPL

    by_style = {}
    for it in ITEMS:
        by_style.setdefault(it["style"], []).append(it["messages"])
    head, tail = DEFAULT_TEXT_QA_PROMPT_TMPL.split("{context_str}")
    for system, user in by_style["llamaindex-query-engine"]:
        assert system["content"] == TEXT_QA_SYSTEM_PROMPT.content
        assert user["content"].startswith(head) and user["content"].endswith("Answer: ")
        assert tail.split("{query_str}")[0] in user["content"]
    for messages in by_style["llamaindex-context-chat"]:
        assert messages[0]["content"].startswith(DEFAULT_CONTEXT_TEMPLATE.split("{context_str}")[0])
    for (user,) in by_style["langchain-rag-prompt"]:
        assert user["content"].startswith("You are an assistant for question-answering tasks. Use the following "
                                          "pieces of retrieved context") and user["content"].endswith("\nAnswer:")
    assert len(by_style["langchain-stuff-documents"]) >= 3 and len(by_style["llamaindex-condense-plus-context"]) >= 3


# -- the scorer on hand-made replies ----------------------------------------------------------------

def test_normalize_and_whole_word_matching():
    assert normalize("It's 1,150 €, at 7:40 - i.e. 3.8 kg. Inés Valdés!") == "its 1150 at 7:40 i e 3.8 kg ines valdes"
    assert has_phrase("The Trailhead weighs 1.3 kg.", "1.3") and not has_phrase("It weighs 11.3 kg", "1.3")
    assert not has_phrase("It is 12.5 km", "12") and not has_phrase("Costs 3.80", "3.8")
    assert has_phrase("On Tuesdays and Thursdays", "Tuesday") and not has_phrase("this", "hi")
    assert has_phrase("The GLASS ORCHARD", "Glass Orchard") and has_phrase("rent: 1,150 euros", "1150")


def test_refusal_rule():
    for reply in ("I don't know.", "The context does not mention the price.", "That isn't mentioned in the text.",
                  "There is no information about pets.", "Sorry, I cannot answer that from the documents.",
                  "The passage doesn't say.", "Unknown.", "It is not specified in the context."):
        assert is_refusal(reply), reply
    for reply in ("The shop is not open on Sundays.", "No, please wipe it with a damp cloth.", "840 metres.",
                  "Dogs must not be off the lead."):
        assert not is_refusal(reply), reply


def test_qa_needs_the_answer_refuses_only_when_it_is_absent_and_avoids_the_distractor():
    present = item("qa", {"answers": ["2017"], "forbid": ["2011"]})
    assert score(present, "The bakery opened in 2017.")["correct"]
    assert score(present, "2017")["correct"]
    assert not score(present, "The restaurant opened in 2011 and the bakery in 2017.")["correct"]
    assert not score(present, "It opened in 20170.")["correct"]
    assert not score(present, "I don't know when the bakery opened; maybe 2017.")["correct"]
    absent = item("qa", {"refuse": True})
    assert score(absent, "The text does not say how much it costs.")["correct"]
    assert not score(absent, "It costs 50 euros.")["correct"]


def test_tool_calls_score_parse_name_and_arguments_separately():
    spec = {"name": "convert_currency", "arguments": {"amount": 250, "from_currency": "EUR"},
            "alternatives": {"to_currency": ["JPY", "yen"]}, "contains": {"note": "gift"},
            "optional": {"round": [True]}}
    it = item("tool_call", spec, [CURRENCY, SEARCH])
    good = {"amount": 250.0, "from_currency": " eur ", "to_currency": "Yen", "note": "A birthday GIFT"}
    assert score(it, call_text("convert_currency", good)) == {"valid": True, "name": True, "correct": True}
    assert score(it, "Sure!\n" + call_text("convert_currency", {**good, "round": True}))["correct"]
    wrong = [({**good, "amount": "250"}, "a number as a string"), ({**good, "to_currency": "USD"}, "wrong value"),
             ({**good, "round": False}, "an optional argument given wrong"), ({**good, "rate": 1.2}, "not in schema"),
             ({k: v for k, v in good.items() if k != "note"}, "a required argument missing"),
             ({**good, "note": "for rent"}, "text without the needed words")]
    for args, why in wrong:
        assert score(it, call_text("convert_currency", args)) == {"valid": True, "name": True, "correct": False}, why
    assert score(it, call_text("web_search", {"query": "yen"})) == {"valid": True, "name": False, "correct": False}
    twice = call_text("convert_currency", good) + "\n" + call_text("convert_currency", good)
    assert score(it, twice)["name"] is False
    assert score(it, '<tool_call>\n{"name": "convert_currency", "arguments": {"amount": </tool_call>')["valid"] is False
    assert score(it, "250 EUR is about 40,000 yen.") == {"valid": False, "name": False, "correct": False}


def test_tool_call_lists_match_in_any_order_and_booleans_are_not_numbers():
    it = item("tool_call", {"name": "convert_currency", "arguments": {"tags": ["a", "B"], "round": True}}, [CURRENCY])
    assert score(it, call_text("convert_currency", {"tags": ["b", "a"], "round": True}))["correct"]
    assert not score(it, call_text("convert_currency", {"tags": ["a"], "round": True}))["correct"]
    assert not score(it, call_text("convert_currency", {"tags": ["a", "b"], "round": 1}))["correct"]


def test_json_scores_validity_each_value_and_the_whole_object():
    it = item("json", {"object": {"name": "Ewa Lind", "age": 29, "nurse": True}, "alternatives": {"name": ["Ewa"]}})
    assert score(it, '{"name": "ewa lind", "age": 29.0, "nurse": true, "city": "Uppsala"}') == {
        "valid": True, "values": 3, "n_values": 3, "correct": True}
    assert score(it, 'Here you go:\n```json\n{"name": "Ewa", "age": 29, "nurse": true}\n```')["correct"]
    assert score(it, '{"name": "Ewa Lind", "age": "29", "nurse": 1}') == {
        "valid": True, "values": 1, "n_values": 3, "correct": False}
    assert score(it, '{"name": "Ewa Lind", "age": 29') == {"valid": False, "values": 0, "n_values": 3,
                                                           "correct": False}
    assert score(it, '["Ewa Lind", 29, true]')["valid"] is False


def test_tool_results_and_chat_are_containment_and_call_no_tool():
    result = item("tool_result", {"answers": ["92.1"], "also": [["78.9", "78.90"]]})
    assert score(result, "100 USD is 92.1 EUR or 78.90 GBP.")["correct"]
    assert not score(result, "100 USD is 92.1 EUR.")["correct"]
    assert not score(result, call_text("convert_currency", {"amount": 100}) + " 92.1 78.9")["correct"]
    chat = item("chat", {"answers": ["Teo"], "forbid": ["Rosa"], "no_call": True}, [SEARCH])
    assert score(chat, "Your brother's name is Teo.")["correct"]
    assert not score(chat, "Rosa and Teo.")["correct"]
    assert not score(chat, call_text("web_search", {"query": "Teo"}))["correct"]
    assert score(item("chat", {"answers": ["hello", "hi"]}), "Hi there! How can I help?")["correct"]


def test_groups_route_the_qa_subsets_without_counting_them_twice():
    qa = [i for i in ITEMS if i["category"] == "qa"]
    picked = qa + [i for i in ITEMS if i["category"] == "chat"][:3]
    rows = groups(picked, list(range(len(picked))))
    assert rows["all"] == list(range(len(picked))) and len(rows["qa"]) == len(qa) and len(rows["chat"]) == 3
    assert set(rows["qa: not in context"]) < set(rows["qa"]) and set(rows["qa: framework prompts"]) < set(rows["qa"])
    assert all(picked[k]["expected"].get("refuse") for k in rows["qa: not in context"])


def test_dlm_eval_offers_the_set():
    from test_commands import _dlm

    done = _dlm("eval", "--help", DLM_LOAD_PLUGINS="dlm_tiny")
    assert done.returncode == 0 and "--set" in done.stdout and "handwritten" in done.stdout, done.stderr


def test_eval_runs_the_set_through_the_chat_template(tmp_path):
    model = train(replace(TINY, out_dir=str(tmp_path / "m"), steps=1))
    picked = [next(i for i in ITEMS if i["category"] == c) for c in MINIMUM]
    path = tmp_path / "slice.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in picked))
    rows, replies = evaluate(str(model), path=path, max_tokens=16)
    assert [r["config"] for r in rows if r["group"] == "all"] == [rows[0]["config"], "llada 1 tok/step, dual"]
    assert rows[0]["config"].startswith("default: ") and len(replies) == 2 * len(picked)
    assert all(r["correct_ci95"][0] <= r["correct"] <= r["correct_ci95"][1] for r in rows)
    assert format_table(rows).count("\n") == len(rows) + 1
