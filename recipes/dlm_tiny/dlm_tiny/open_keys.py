"""QA and tool calls keyed by open-ended words: the request names what it wants in words the
passage or the tool list also uses, and those words are drawn from pools too large to memorise.

The first open families (:mod:`open_qa`, :mod:`open_tools`) word each relation and task in two to
six fixed ways; after 6700 steps a model matched those strings and still picked the relation or the
tool at chance on prompts worded otherwise (findings.md, "h1"). Here the attribute asked about
("the delivery deadline", "the zelkan score") and the tool's task ("delete the calendar event",
"get the tide times") are composed from modifier, head, verb and noun pools (thousands of keys, a
few hundred tasks), and the distractors share half the key: the same attribute of another subject,
another attribute of the same subject, the same noun under another verb, the same verb on another
noun. Only reading both halves of the request and finding them in the prompt gets the answer.
The tool families are in :mod:`open_key_tools`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from dlm_tiny.entities import Entities
from dlm_tiny.open_json import json_messages, json_schema
from dlm_tiny.open_qa import NOT_IN_CONTEXT, noisy_question, qa_messages
from dlm_tiny.open_words import COLOURS, LANGUAGE_NAMES, KINDS, Values

MODIFIERS = ["", "", "", "maximum", "minimum", "average", "total", "annual", "monthly", "daily", "official", "current",
             "original", "first", "last", "main", "home", "opening", "closing", "starting", "base", "team", "launch",
             "entry", "membership", "delivery", "return", "booking", "support", "billing", "shipping", "backup",
             "target", "reserve", "summer", "winter", "evening", "weekend", "export", "service"]
HEADS = {   # attribute head -> how its values are written
    "speed": "unit", "capacity": "count", "budget": "price", "code": "code", "number": "count", "date": "date",
    "colour": "colour", "size": "unit", "weight": "unit", "length": "unit", "height": "unit", "width": "unit",
    "score": "count", "rating": "count", "rank": "count", "price": "price", "fee": "price", "cost": "price",
    "limit": "count", "owner": "person", "manager": "person", "contact": "person", "address": "street",
    "phone number": "phone", "email": "email", "port": "place", "version": "code", "model": "code",
    "year": "year", "temperature": "unit", "range": "unit", "duration": "unit", "deadline": "date",
    "level": "count", "balance": "price", "population": "count", "motto": "word", "nickname": "word",
    "theme": "word", "origin": "place", "destination": "place", "platform": "count", "gate": "code",
    "room": "code", "floor": "count", "serial number": "code", "time": "time", "partner": "person",
    "supplier": "company", "sponsor": "company", "language": "language", "password hint": "word",
}
UNITS = ["km", "metres", "kg", "hours", "minutes", "litres", "degrees", "km/h", "cm", "GB", "watts", "days"]
STATEMENTS = ["The {k} of {s} is {v}.", "{s}'s {k} is {v}.", "{s} has {a} {k} of {v}.", "For {s}, the {k} is {v}.",
              "{v} is the {k} of {s}.", "{s} lists its {k} as {v}.", "The {k} for {s} is {v}.", "{s}'s {k}: {v}.",
              "As for {s}, its {k} is {v}.", "{s} reports {a} {k} of {v}.", "The {k} of {s} was set to {v}.",
              "We have {v} down as the {k} of {s}.", "{s} ({k}: {v})."]
QUESTIONS = ["What is the {k} of {s}?", "What's the {k} of {s}?", "What is {s}'s {k}?", "Tell me the {k} of {s}.",
             "Give me the {k} for {s}.", "I need the {k} of {s}.", "Which {k} does {s} have?", "Do you know the {k} of {s}?",
             "Find the {k} of {s}.", "{K} of {s}?", "{s}: {k}?", "Look up the {k} for {s}.", "What {k} does {s} have?",
             "Can you tell me what the {k} of {s} is?", "What does the text give as the {k} of {s}?",
             "Please state the {k} of {s}.", "{s} - what's its {k}?", "And the {k} of {s}?"]


def draw_value(vals: Values, how: str) -> str:
    """A value written the way ``how`` (a :data:`HEADS` value) says: "12.5 km", "€40", "Lena Ortiz"."""
    rng, ent = vals.rng, vals.ent
    return {"unit": lambda: f"{rng.choice([rng.randint(1, 999), round(rng.uniform(0.5, 99), 1)])} {rng.choice(UNITS)}",
            "count": lambda: vals.count(1, 9999), "price": lambda: vals.price()[0], "code": lambda: vals.code(),
            "date": vals.date, "colour": lambda: rng.choice(COLOURS), "person": vals.person, "street": vals.street,
            "phone": vals.phone, "email": vals.email, "place": vals.place, "year": vals.year, "time": vals.time,
            "word": lambda: ent.name(), "company": ent.company, "language": lambda: rng.choice(LANGUAGE_NAMES)}[how]()


def draw_key(rng: random.Random, ent: Entities) -> tuple[str, str]:
    """(the attribute's words, how its value is written); 1 in 8 has a made-up modifier."""
    head = rng.choice(sorted(HEADS))
    mod = ent.name().lower() if rng.random() < 0.125 else rng.choice(MODIFIERS)
    return (f"{mod} {head}" if mod else head), HEADS[head]


def _passage(rng: random.Random, facts: dict, subjects: list[str], keys: list[str]) -> tuple[list[str], Callable[[], str]]:
    """(the facts as sentences, a layout of them: prose, lines, bullets, a markdown table, records, JSON)."""
    sentences = []
    for (s, k), v in facts.items():
        shape = rng.choice(STATEMENTS)
        sentence = shape.format(s=s, k=k, v=v, a="an" if k[0] in "aeiou" else "a")
        # a sentence opens with a capital, unless it opens with the value: "joe@x.org" is not "Joe@x.org"
        sentences.append(sentence if shape.startswith("{v}") else sentence[0].upper() + sentence[1:])
    rng.shuffle(sentences)
    full = all((s, k) in facts for s in subjects for k in keys)
    style = rng.randrange(7)

    def layout() -> str:
        if style == 0 and full:
            head = "| Name | " + " | ".join(k.title() for k in keys) + " |"
            rows = ["| " + " | ".join([s] + [facts[(s, k)] for k in keys]) + " |" for s in subjects]
            return "\n".join([head, "|" + "---|" * (len(keys) + 1)] + rows)
        if style == 1:
            return "\n\n".join("\n".join([f"Name: {s}"] + [f"{k.capitalize()}: {v}" for (t, k), v in facts.items() if t == s])
                               for s in subjects)
        if style == 2 and full:
            records = [{"name": s, **{k: facts[(s, k)] for k in keys}} for s in subjects]
            return json.dumps(records, indent=rng.choice([None, 2]), ensure_ascii=False)   # "€5", not "\\u20ac5"
        if style == 3:
            return "\n".join(rng.choice(["- ", "* "]) + t for t in sentences)
        if style == 4:
            return "\n".join(sentences)
        return " ".join(sentences)
    return sentences, layout


def keyed_qa(rng: random.Random, ent: Entities, unanswerable: float = 0.1) -> dict:
    """A passage of 1-4 subjects with 1-4 open-ended attributes each; the question names one pair."""
    vals = Values(rng, ent)
    kind = rng.choice(sorted(KINDS) + ["person"])
    subjects = list(dict.fromkeys(vals.person() if kind == "person" else vals.subject(kind)
                                  for _ in range(rng.choice([1, 2, 2, 3, 4]))))
    keys, n_keys = {}, rng.randint(1, 4)
    while len(keys) < n_keys:
        k, how = draw_key(rng, ent)
        keys[k] = how
    shared = rng.random() < 0.5          # every subject has every key (tables) or each its own few
    facts = {(s, k): draw_value(vals, how) for s in subjects for k, how in keys.items()
             if shared or rng.random() < 0.6}
    if not facts:
        facts[(subjects[0], next(iter(keys)))] = draw_value(vals, next(iter(keys.values())))
    if rng.random() < unanswerable:
        absent = [(s, k) for s in subjects for k in keys if (s, k) not in facts]
        s, k = rng.choice(absent) if absent else (rng.choice(subjects), draw_key(rng, ent)[0])
        if (s, k) in facts:
            k = draw_key(rng, ent)[0] + " rating"
        answer = NOT_IN_CONTEXT
    else:
        s, k = rng.choice(sorted(facts))
        answer = facts[(s, k)]
    sentences, layout = _passage(rng, facts, subjects, list(keys))
    question = rng.choice(QUESTIONS).format(s=s, k=k, K=k.capitalize())
    question = noisy_question(rng, question[0].upper() + question[1:])
    messages = qa_messages(rng, sentences, layout, question)
    return {"messages": messages, "target": answer, "expected": {"answer": answer}}


# -- JSON: the schema's keys are the text's words -------------------------------------------------
JSON_TYPES = {"count": "integer", "year": "integer", "price": "number"}   # every other value is a string


def _json_key(words: str, style: int) -> str:
    """"delivery deadline" as a key: delivery_deadline (snake case) or deliveryDeadline (camel case)."""
    parts = words.replace("-", " ").split()
    return "_".join(parts) if style == 0 else parts[0] + "".join(p.capitalize() for p in parts[1:])


def keyed_json(rng: random.Random, ent: Entities) -> dict:
    """Extract 1-5 open-ended attributes of one subject as JSON; the text gives up to 3 more.

    The keys are the attributes' own words, so the model must find each key's words in the text
    and copy the value there, typed as the schema says (a price's amount as a number).
    """
    vals = Values(rng, ent)
    kind = rng.choice(sorted(KINDS) + ["person"])
    subject = vals.person() if kind == "person" else vals.subject(kind)
    keys = {}
    for _ in range(rng.randint(2, 7)):
        k, how = draw_key(rng, ent)
        keys.setdefault(k, how)
    facts, fields, style = {}, [], int(rng.random() < 0.3)
    asked = rng.sample(list(keys), rng.randint(1, min(5, len(keys))))
    for k, how in keys.items():
        if how == "price":
            text, amount = vals.price()
        else:
            text = draw_value(vals, how)
            amount = int(text) if how in JSON_TYPES else text
        facts[(subject, k)] = text
        if k in asked:
            fields.append((_json_key(k, style), JSON_TYPES.get(how, "string"), amount))
    rng.shuffle(fields)
    if rng.random() < 0.4:          # the record's own name first, as most schemas have it
        fields.insert(0, (rng.choice(["name", "title", "subject"]), "string", subject.removeprefix("the ").strip('"')))
    sentences, layout = _passage(rng, facts, [subject], list(keys))
    obj, schema = {k: v for k, _, v in fields}, json_schema(fields, titled=rng.random() < 0.3)
    return {"messages": json_messages(rng, kind, layout(), fields, schema),
            "target": json.dumps(obj, ensure_ascii=False), "expected": {"object": obj, "schema": schema}}
