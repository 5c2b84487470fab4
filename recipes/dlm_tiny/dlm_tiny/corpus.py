"""Seeded synthetic instruction corpus: what agents and RAG pipelines ask of a small model.

Each example is a conversation (``messages`` and optional ``tools``, as the OpenAI API and the
frameworks send them), the assistant reply to learn, and what the evaluation checks. Training and
evaluation draw from disjoint entity splits (see :mod:`entities`) and different seeds.
"""

from __future__ import annotations

import json
import random
from dlm_tiny.drills import arithmetic, chat, copy_task, list_task
from dlm_tiny.entities import COLORS, JOBS, ANIMALS, SPORTS, Entities
from dlm_tiny.example import Example
from dlm_tiny.open_json import open_chat, open_json
from dlm_tiny.open_key_tools import keyed_tool_call, keyed_tool_result
from dlm_tiny.open_keys import keyed_json, keyed_qa
from dlm_tiny.open_qa import NOT_IN_CONTEXT, open_qa
from dlm_tiny.open_tools import open_tool_call, open_tool_result
from dlm_tiny.prose_qa import ProseBank, prose_qa
from dlm_tiny.prose_text import prose_text
from dlm_tiny.rag_templates import framework_rag
from dlm_tiny.tools_catalog import SCHEMAS, make_call
from dlm_backend.chat.tool_calls import call_text
from dlm_backend.errors import DLMError

FAMILIES = {"qa": 0.23, "tool_call": 0.17, "tool_result": 0.09, "json": 0.14, "arithmetic": 0.08, "list": 0.09,
            "chat": 0.05, "copy": 0.15,
            # the same tasks in many surface forms (open_*.py): 0 unless named, and last, so older
            # stages draw what they drew before (random.choices reads one number per draw)
            "qa_open": 0.0, "tool_open": 0.0, "tool_result_open": 0.0, "json_open": 0.0, "chat_open": 0.0,
            # the request's own words name what it wants (open_keys.py)
            "qa_keyed": 0.0, "tool_keyed": 0.0, "json_keyed": 0.0, "tool_result_keyed": 0.0,
            # news passages and a teacher's questions (prose_qa.py), and the same articles as plain
            # text to denoise (prose_text.py): both need ``prose_bank``
            "qa_prose": 0.0, "text_prose": 0.0}
#: how an open family's answers are scored: as the first family's of the same task
SCORED_AS = {"qa_open": "qa", "tool_open": "tool_call", "tool_result_open": "tool_result", "json_open": "json",
             "chat_open": "chat", "qa_keyed": "qa", "tool_keyed": "tool_call",
             "json_keyed": "json", "tool_result_keyed": "tool_result", "qa_prose": "qa"}
#: what the held-out evaluation scores; ``copy`` is practice only (see :func:`copy_task`).
EVAL_FAMILIES = ["qa", "tool_call", "tool_result", "json", "arithmetic", "list", "chat"]


# -- grounded question answering ---------------------------------------------------------------

ATTRS = {
    "city": (lambda e, r: e.city(), "{n} lives in {v}.",
             ["Where does {n} live?", "In which city does {n} live?", "What city is {n} from?"]),
    "job": (lambda e, r: r.choice(JOBS), "{n} works as a {v}.",
            ["What is {n}'s job?", "What does {n} do for work?", "What is the profession of {n}?"]),
    "pet": (lambda e, r: r.choice(ANIMALS), "{n} has a pet {v}.",
            ["What pet does {n} have?", "Which animal does {n} keep as a pet?"]),
    "color": (lambda e, r: r.choice(COLORS), "{n}'s favorite color is {v}.",
              ["What is {n}'s favorite color?", "Which color does {n} like most?"]),
    "sport": (lambda e, r: r.choice(SPORTS), "{n} plays {v}.",
              ["Which sport does {n} play?", "What sport does {n} play?"]),
    "age": (lambda e, r: str(r.randint(18, 90)), "{n} is {v} years old.",
            ["How old is {n}?", "What is the age of {n}?"]),
    "company": (lambda e, r: e.company(), "{n} works at {v}.",
                ["Where does {n} work?", "Which company employs {n}?"]),
}

QA_WRAPPERS = [
    lambda p, q: [{"role": "user", "content": f"Context:\n{p}\n\nQuestion: {q}"}],
    lambda p, q: [{"role": "system", "content": f"Answer using only this context.\n\n{p}"},
                  {"role": "user", "content": q}],
    lambda p, q: [{"role": "user", "content": (
        "Context information is below.\n---------------------\n" + p + "\n---------------------\n"
        "Given the context information and not prior knowledge, answer the query.\n"
        f"Query: {q}\nAnswer: ")}],
    lambda p, q: [{"role": "user", "content": (
        "Use the following pieces of retrieved context to answer the question. If you don't know the "
        f"answer, say that you don't know.\n\n{p}\n\nQuestion: {q}")}],
    lambda p, q: [{"role": "user", "content": f"{p}\n\n{q}"}],
]


def qa(rng: random.Random, ent: Entities, unanswerable: float = 0.15, hard: float = 0.0,
       rag: float = 0.0) -> Example:
    """A context of facts about 1-3 people and one question about one of them.

    With probability ``hard`` someone else in the context has the asked attribute too, so the
    answer cannot be found by the attribute alone: the model must bind the value to the person
    (dlm-tiny's QA misses are nearly all that confusion: "How old is Fegrex?" answered with
    Grourtex's age). ``hard=0`` draws nothing extra, so older corpora are unchanged. The label
    ``distractor`` holds only when that other value differs from the answer: jobs, pets, colours
    and sports come from short lists, so two people often share one, and then the attribute alone
    answers (runs before r2 labelled such questions distractors too).

    With probability ``rag`` the prompt is one a RAG framework sends (:mod:`rag_templates`), and
    ``expected["template"]`` names it.
    """
    people = [ent.name() for _ in range(rng.randint(1, 3))]
    facts, known = [], {}
    for person in people:
        for attr in rng.sample(sorted(ATTRS), rng.randint(1, 3)):
            value = ATTRS[attr][0](ent, rng)
            known[(person, attr)] = value
            facts.append(ATTRS[attr][1].format(n=person, v=value))
    rng.shuffle(facts)
    if rng.random() < unanswerable:    # an attribute nobody mentioned, or a stranger
        person = rng.choice(people + [ent.name()])
        attr = rng.choice([a for a in sorted(ATTRS) if (person, a) not in known])
        answer = NOT_IN_CONTEXT
    else:
        person, attr = rng.choice(sorted(known))
        answer = known[(person, attr)]
    if hard and rng.random() < hard and not any(p != person and a == attr for p, a in known):
        other = rng.choice([p for p in people if p != person] or [ent.name()])
        known[(other, attr)] = ATTRS[attr][0](ent, rng)
        facts.insert(rng.randrange(len(facts) + 1), ATTRS[attr][1].format(n=other, v=known[(other, attr)]))
    # a distractor only when the other value differs: with the same value the attribute alone answers
    distractor = any(p != person and a == attr and v != answer for (p, a), v in known.items())
    question = rng.choice(ATTRS[attr][2]).format(n=person)
    expected = {"answer": answer, "distractor": distractor}
    if rag and rng.random() < rag:   # a framework's RAG prompt (rag_templates.py); 0 draws nothing
        expected["template"], messages = framework_rag(rng, facts, question)
    else:
        messages = rng.choice(QA_WRAPPERS)(" ".join(facts), question)
    return Example("qa", messages, answer, expected=expected)


# -- tools --------------------------------------------------------------------------------------

def _toolset(rng: random.Random, name: str, most_others: int = 2) -> list[dict]:
    others = rng.sample([n for n in sorted(SCHEMAS) if n != name], rng.randint(0, most_others))
    names = others + [name]
    rng.shuffle(names)
    return [SCHEMAS[n] for n in names]


def tool_call(rng: random.Random, ent: Entities) -> Example:
    name = rng.choice(sorted(SCHEMAS))
    tools = _toolset(rng, name)
    if rng.random() < 0.1:     # tools offered, none needed
        ex = chat(rng, ent)
        return Example("tool_call", ex.messages, ex.target, tools, {"no_call": True, "answers": ex.expected["answers"]})
    args, ask, _, _ = make_call(name, rng, ent)
    messages = [{"role": "user", "content": ask}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": rng.choice(
            ["You are a helpful assistant with tools.", "Use the tools when they help.", "You are an agent."])})
    return Example("tool_call", messages, call_text(name, args), tools, {"name": name, "arguments": args})


def tool_result(rng: random.Random, ent: Entities) -> Example:
    name = rng.choice(sorted(SCHEMAS))
    args, ask, result, answer = make_call(name, rng, ent)
    call = {"id": f"call_{rng.randint(1000, 9999)}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}
    messages = [{"role": "user", "content": ask},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": result}]
    # One distractor at most: the reply copies from the result, and every schema token is prompt compute.
    return Example("tool_result", messages, answer, _toolset(rng, name, 1), {"answer": answer})


# -- structured output ----------------------------------------------------------------------------

JSON_SCHEMAS = {
    "person": ({"name": "string", "age": "integer", "city": "string"},
               lambda e, r: {"name": e.name(), "age": r.randint(18, 90), "city": e.city()},
               ["{name} is {age} years old and lives in {city}.", "Meet {name} from {city}, aged {age}.",
                "{name}, {age}, {city}."]),
    "product": ({"product": "string", "price": "number", "color": "string"},
                lambda e, r: {"product": e.product(), "price": r.randint(5, 999), "color": r.choice(COLORS)},
                ["The {product} costs {price} dollars and comes in {color}.",
                 "{product}: {color}, price {price}.", "Buy the {color} {product} for {price}."]),
    "event": ({"event": "string", "date": "string", "city": "string"},
              lambda e, r: {"event": r.choice(["concert", "fair", "marathon", "conference", "festival"]),
                            "date": e.date(), "city": e.city()},
              ["The {event} takes place in {city} on {date}.", "On {date} there is a {event} in {city}.",
               "{city} hosts a {event} on {date}."]),
    "pet": ({"name": "string", "animal": "string", "age": "integer"},
            lambda e, r: {"name": e.name(), "animal": r.choice(ANIMALS), "age": r.randint(1, 20)},
            ["{name} is a {age} year old {animal}.", "Our {animal} {name} turned {age}.",
             "{name} the {animal} is {age}."]),
}


def json_schema_for(kind: str) -> dict:
    props, _, _ = JSON_SCHEMAS[kind]
    return {"type": "object", "properties": {k: {"type": t} for k, t in props.items()},
            "required": list(props)}


def structured(rng: random.Random, ent: Entities) -> Example:
    kind = rng.choice(sorted(JSON_SCHEMAS))
    _, make, texts = JSON_SCHEMAS[kind]
    obj = make(ent, rng)
    text = rng.choice(texts).format(**obj)
    schema = json.dumps(json_schema_for(kind))
    style = rng.randrange(3)
    if style == 0:
        messages = [{"role": "user", "content": f"Extract the {kind} as JSON matching this schema.\nSchema: {schema}\nText: {text}"}]
    elif style == 1:
        messages = [{"role": "system", "content": f"Respond only with a JSON object that matches this JSON schema: {schema}"},
                    {"role": "user", "content": text}]
    else:
        messages = [{"role": "user", "content": f"{text}\n\nReturn a JSON object with the keys {', '.join(obj)}."}]
    return Example("json", messages, json.dumps(obj), expected={"object": obj, "schema": json_schema_for(kind)})


GENERATORS = {"qa": qa, "tool_call": tool_call, "tool_result": tool_result, "json": structured,
              "arithmetic": arithmetic, "list": list_task, "chat": chat, "copy": copy_task}
OPEN_GENERATORS = {"tool_open": open_tool_call, "tool_result_open": open_tool_result, "json_open": open_json,
                   "chat_open": open_chat, "tool_keyed": keyed_tool_call, "json_keyed": keyed_json,
                   "tool_result_keyed": keyed_tool_result}


def generate(n: int, seed: int, split: str = "train", families: list[str] | None = None,
             weights: dict[str, float] | None = None, unanswerable: float = 0.15,
             qa_hard: float = 0.0, rag_templates: float = 0.0, prose_bank: str = "") -> list[Example]:
    """``n`` examples; families drawn by weight, or round-robin over ``families`` when given.

    ``weights`` overrides some of :data:`FAMILIES` and ``unanswerable`` is the share of QA questions
    whose answer is not in the context, ``qa_hard`` the share with a same-attribute distractor
    (see :func:`qa`), ``rag_templates`` the share in a RAG framework's own prompt: training mixes
    (the held-out set keeps the defaults, so a stage over-sampling a skill is scored on the usual mix).
    ``prose_bank`` is the question file ``qa_prose`` draws from (:class:`prose_qa.ProseBank`).
    """
    rng = random.Random(seed)
    ent = Entities(rng, split)
    names, mix = zip(*{**FAMILIES, **(weights or {})}.items())
    bank = ProseBank(prose_bank, held_out=split != "train") if prose_bank else None
    out = []
    for i in range(n):
        family = families[i % len(families)] if families else rng.choices(names, mix)[0]
        if family in ("qa_prose", "text_prose") and bank is None:
            raise DLMError(f"the {family} family reads a question bank and its articles: pass --prose-bank "
                           f"(probes/write_prose_questions.py writes one), or give {family} no weight")
        if family == "qa":
            out.append(qa(rng, ent, unanswerable, qa_hard, rag_templates))
        elif family in SCORED_AS:
            if family == "qa_open":
                d = open_qa(rng, ent, unanswerable, qa_hard)
            elif family == "qa_keyed":
                d = keyed_qa(rng, ent, unanswerable)
            elif family == "qa_prose":
                d = prose_qa(rng, bank, unanswerable)
            else:
                d = OPEN_GENERATORS[family](rng, ent)
            out.append(Example(family, d["messages"], d["target"], d.get("tools"), d["expected"]))
        elif family == "text_prose":      # no conversation: see train.encode_examples
            out.append(Example(family, [], prose_text(rng, bank)))
        else:
            out.append(GENERATORS[family](rng, ent))
    return out
