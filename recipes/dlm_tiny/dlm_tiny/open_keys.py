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
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from dlm_tiny.entities import Entities
from dlm_tiny.open_json import json_messages, json_schema
from dlm_tiny.open_qa import NOT_IN_CONTEXT, noisy_question, qa_messages
from dlm_tiny.open_tool_frames import Frame, P
from dlm_tiny.open_tools import build_tool, call_example
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


def _value(vals: Values, how: str) -> str:
    rng, ent = vals.rng, vals.ent
    return {"unit": lambda: f"{rng.choice([rng.randint(1, 999), round(rng.uniform(0.5, 99), 1)])} {rng.choice(UNITS)}",
            "count": lambda: vals.count(1, 9999), "price": lambda: vals.price()[0], "code": lambda: vals.code(),
            "date": vals.date, "colour": lambda: rng.choice(COLOURS), "person": vals.person, "street": vals.street,
            "phone": vals.phone, "email": vals.email, "place": vals.place, "year": vals.year, "time": vals.time,
            "word": lambda: ent.name(), "company": ent.company, "language": lambda: rng.choice(LANGUAGE_NAMES)}[how]()


def _key(rng: random.Random, ent: Entities) -> tuple[str, str]:
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
        k, how = _key(rng, ent)
        keys[k] = how
    shared = rng.random() < 0.5          # every subject has every key (tables) or each its own few
    facts = {(s, k): _value(vals, how) for s in subjects for k, how in keys.items()
             if shared or rng.random() < 0.6}
    if not facts:
        facts[(subjects[0], next(iter(keys)))] = _value(vals, next(iter(keys.values())))
    if rng.random() < unanswerable:
        absent = [(s, k) for s in subjects for k in keys if (s, k) not in facts]
        s, k = rng.choice(absent) if absent else (rng.choice(subjects), _key(rng, ent)[0])
        if (s, k) in facts:
            k = _key(rng, ent)[0] + " rating"
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
        k, how = _key(rng, ent)
        keys.setdefault(k, how)
    facts, fields, style = {}, [], int(rng.random() < 0.3)
    asked = rng.sample(list(keys), rng.randint(1, min(5, len(keys))))
    for k, how in keys.items():
        if how == "price":
            text, amount = vals.price()
        else:
            text = _value(vals, how)
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


# -- tools: a task is a verb on a noun ------------------------------------------------------------
VERBS = {   # meaning -> (tool-name verbs, how a request says it, how a description says it); {n} the noun
    "get": (["get", "fetch", "lookup", "read", "retrieve", "show"],
            ["What is the {n} {pp}?", "Get the {n} {pp}.", "Show me the {n} {pp}.", "Look up the {n} {pp}.",
             "Can you fetch the {n} {pp}?", "I need the {n} {pp}.", "Check the {n} {pp}."],
            ["Get the {n}.", "Returns the {n}.", "Look up the {n}.", "Retrieve the current {n}."]),
    "create": (["create", "add", "new", "make"],
               ["Create a {n} {pp}.", "Add a new {n} {pp}.", "Please make a {n} {pp}.", "Set up a {n} {pp}.",
                "Can you add a {n} {pp}?"], ["Create a new {n}.", "Adds a {n}.", "Make a {n} and return it."]),
    "delete": (["delete", "remove", "cancel"],
               ["Delete the {n} {pp}.", "Remove the {n} {pp}.", "Cancel the {n} {pp}.", "Get rid of the {n} {pp}.",
                "Please delete the {n} {pp}."], ["Delete a {n}.", "Removes the {n} permanently.", "Cancel a {n}."]),
    "update": (["update", "edit", "change", "modify"],
               ["Update the {n} {pp}.", "Change the {n} {pp}.", "Edit the {n} {pp}.", "Can you update the {n} {pp}?"],
               ["Update an existing {n}.", "Edits the {n}.", "Change the details of a {n}."]),
    "search": (["search", "find", "list", "query"],
               ["Search for {n} {pp}.", "Find {n} {pp}.", "List the {n} {pp}.", "Are there any {n} {pp}?"],
               ["Search {n} records.", "Find {n} entries matching the filters.", "List {n} items."]),
    "send": (["send", "share", "forward"],
             ["Send the {n} {pp}.", "Share the {n} {pp}.", "Forward the {n} {pp}.", "Please send the {n} {pp}."],
             ["Send a {n}.", "Shares the {n} with someone.", "Forward a {n}."]),
}
NOUNS = ["invoice", "order", "support ticket", "playlist", "recipe", "parcel", "stock price", "exchange rate",
         "train times", "bus schedule", "meeting", "reminder", "calendar event", "contact", "note", "task",
         "bank balance", "flight status", "hotel room", "table reservation", "movie showtimes", "news headlines",
         "air quality", "traffic report", "tide times", "pollen count", "sunrise time", "parking spot", "gift card",
         "coupon", "subscription", "user account", "blog post", "comment", "photo album", "document", "spreadsheet",
         "shopping list", "wishlist", "product review", "warranty", "insurance quote", "tax rate", "timesheet",
         "vacation request", "expense report", "lab result", "prescription", "doctor appointment", "gym class",
         "workout plan", "meal plan", "book loan", "library card", "course grade", "exam date", "job posting",
         "interview slot", "server status", "error log", "deployment", "pull request", "build status",
         "database backup", "dns record", "api key", "webhook", "sensor reading", "thermostat setting", "door lock",
         "fuel price", "ride estimate", "bike rental", "ferry times", "museum tickets", "concert tickets",
         "sports score", "league table", "player stats", "word definition", "time zone", "holiday calendar",
         "crypto price", "mortgage rate", "energy usage", "water bill", "phone plan", "data usage", "shipping cost",
         "return label", "refund", "loyalty points", "seat map", "boarding pass", "visa requirement", "podcast episode",
         "pet vaccination", "car service", "package tracking", "event ticket", "team roster", "survey result"]
ARGS = {    # meaning -> (parameter names, how a request gives the value, type, value, description)
    "ref": ("id ref reference number", ["number {ref}", "#{ref}", "with ID {ref}", "{ref}"], "string",
            lambda v: v.code(), "The identifier"),
    "city": ("city location place city_name", ["in {city}", "for {city}", "near {city}"], "string",
             lambda v: v.place(), "The city"),
    "date": ("date day on_date when", ["on {date}", "for {date}"], "string", lambda v: v.date(), "The date"),
    "person": ("name person customer user owner contact_name", ["for {person}", "of {person}", "belonging to {person}"],
               "string", lambda v: v.person(), "The person's name"),
    "email": ("email recipient to email_address", ["to {email}", "for {email}"], "string", lambda v: v.email(),
              "Email address"),
    "count": ("limit count max_results quantity", ["with a limit of {count}", "up to {count}", "quantity {count}"],
              "integer", lambda v: v.rng.randint(1, 50), "How many"),
    "title": ("title query text label", ['titled "{title}"', 'called "{title}"', 'named "{title}"'], "string",
              lambda v: v.title(), "The title or search text"),
    "language": ("language lang", ["in {language}"], "string", lambda v: v.rng.choice(LANGUAGE_NAMES), "Language"),
    "time": ("time at start_time", ["at {time}"], "string", lambda v: v.time(), "The time"),
}


def _frame(rng: random.Random, verb: str, noun: str, meanings: list[str]) -> Frame:
    """A tool for one task: the verb on the noun, with ``meanings`` as required parameters."""
    verbs, asks, descs = VERBS[verb]
    params = {m: P(ARGS[m][0], ARGS[m][2], ARGS[m][3], ARGS[m][4]) for m in meanings}
    pp = " ".join(rng.choice(ARGS[m][1]) for m in meanings)
    ask = rng.choice(asks).replace("{n}", noun).replace(" {pp}", f" {pp}" if pp else "")
    names = tuple((v, noun.replace(" ", "_")) for v in verbs)
    return Frame(names, tuple(d.format(n=noun) for d in descs), params, tuple(meanings), (ask,))


def keyed_tool_call(rng: random.Random, ent: Entities) -> dict:
    """A request for one task among 1-4 offered tools that share its verb or its noun."""
    vals = Values(rng, ent)
    verb, noun = rng.choice(sorted(VERBS)), rng.choice(NOUNS)
    frame = _frame(rng, verb, noun, rng.sample(sorted(ARGS), rng.choice([0, 1, 1, 2, 2, 3])))
    tool, names = build_tool(rng, frame)
    tools, seen = [tool], {tool["function"]["name"]}
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3])):
        other = (rng.choice(sorted(set(VERBS) - {verb})), noun) if rng.random() < 0.5 else (verb, rng.choice(NOUNS))
        if other[1] == noun and other[0] == verb:
            continue
        distractor = build_tool(rng, _frame(rng, *other, rng.sample(sorted(ARGS), rng.choice([0, 1, 2]))))[0]
        if distractor["function"]["name"] not in seen:
            tools.append(distractor)
            seen.add(distractor["function"]["name"])
    rng.shuffle(tools)
    return call_example(rng, vals, frame, tools, names, tool["function"]["name"])
