"""JSON extraction against open-ended schemas, and chat that remembers what the user said.

The first JSON family had four fixed schemas. Here a record kind (a person, a product, an order...)
offers 4-6 fields, each example takes 2-5 of them under freshly drawn key names and types, writes
the text in any field order with the record's name or a pronoun, and asks for the JSON in one of
the ways applications ask (a JSON schema, a key list, LangChain's format instructions, a template
to fill). The reply is the object, keys in the schema's order.
"""

from __future__ import annotations

import json
import random

from dlm_tiny.entities import Entities
from dlm_tiny.open_words import COLOURS, STATUSES, Values

# kind: (pronoun, {meaning: (key names, type, value, phrases with {a} the anchor and {v} the value)})
# The first field is the anchor: the record's name, written first.
RECORDS = {
    "person": ("They", {
        "name": ("name full_name person_name", "string", lambda v: v.ent.full_name(), ["{v} is someone I met.", "Meet {v}."]),
        "age": ("age years age_years", "integer", lambda v: v.rng.randint(18, 90), ["{a} is {v} years old.", "{a} turned {v} last month."]),
        "city": ("city location hometown lives_in", "string", lambda v: v.place(), ["{a} lives in {v}.", "{a} is based in {v}."]),
        "email": ("email email_address contact_email", "string", lambda v: v.email(), ["{a} can be reached at {v}.", "{a}'s email is {v}."]),
        "job": ("job occupation role title", "string", lambda v: v.rng.choice(
            ["nurse", "engineer", "teacher", "designer", "accountant", "chef", "pilot"]), ["{a} works as a {v}.", "{a} is a {v}."]),
        "married": ("married is_married", "boolean", lambda v: v.rng.random() < 0.5, ["{a} is {vb}married."]),
    }),
    "product": ("It", {
        "name": ("name product product_name item", "string", lambda v: v.ent.product(), ["The {v} is new this year.", "Introducing the {v}."]),
        "price": ("price cost price_usd", "number", lambda v: v.price()[1], ["{a} costs {v} dollars.", "{a} sells for ${v}."]),
        "color": ("color colour", "string", lambda v: v.rng.choice(COLOURS), ["{a} comes in {v}.", "{a} is {v}."]),
        "in_stock": ("in_stock available is_available", "boolean", lambda v: v.rng.random() < 0.5, ["{a} is {vb}in stock.", "{a} is {vb}available right now."]),
        "rating": ("rating stars score", "number", lambda v: v.rng.choice([3, 3.5, 4, 4.2, 4.5, 4.8, 5]), ["{a} is rated {v} stars.", "Reviewers give {a} {v} out of 5."]),
        "brand": ("brand maker manufacturer", "string", lambda v: v.ent.company(), ["{a} is made by {v}.", "{v} makes {a}."]),
    }),
    "event": ("It", {
        "title": ("title event name event_name", "string", lambda v: f"{v.ent.name()} {v.rng.choice(['Festival', 'Summit', 'Fair', 'Marathon', 'Gala'])}",
                  ["The {v} is coming up.", "Save the date for the {v}."]),
        "date": ("date event_date when", "string", lambda v: v.date(), ["{a} takes place on {v}.", "{a} is on {v}."]),
        "city": ("city location venue_city place", "string", lambda v: v.place(), ["{a} is held in {v}.", "{a} happens in {v}."]),
        "attendees": ("attendees expected_attendance guests capacity", "integer", lambda v: v.rng.randint(20, 50000), ["About {v} people are expected at {a}.", "{a} expects {v} guests."]),
        "ticket_price": ("ticket_price price entry_fee", "number", lambda v: v.rng.randint(0, 300), ["Tickets for {a} cost {v} euros.", "Entry to {a} is {v} dollars."]),
    }),
    "book": ("It", {
        "title": ("title book_title name", "string", lambda v: v.title(), ["{v} is a book.", "I just read {v}."]),
        "author": ("author writer author_name", "string", lambda v: v.ent.full_name(), ["{a} was written by {v}.", "{v} wrote {a}."]),
        "year": ("year published publication_year", "integer", lambda v: v.rng.randint(1800, 2024), ["{a} was published in {v}.", "{a} came out in {v}."]),
        "pages": ("pages page_count num_pages", "integer", lambda v: v.rng.randint(40, 1200), ["{a} has {v} pages.", "{a} runs to {v} pages."]),
    }),
    "order": ("It", {
        "order_id": ("order_id id order_number", "string", lambda v: v.code("A"), ["Order {v} was placed today.", "This is about order {v}."]),
        "customer": ("customer customer_name buyer", "string", lambda v: v.ent.full_name(), ["{a} was placed by {v}.", "{v} placed {a}."]),
        "quantity": ("quantity qty items count", "integer", lambda v: v.rng.randint(1, 40), ["{a} contains {v} items.", "{a} is for {v} units."]),
        "total": ("total amount total_price", "number", lambda v: round(v.rng.uniform(5, 3000), 2), ["The total for {a} is {v} dollars.", "{a} came to {v} euros."]),
        "status": ("status state order_status", "enum", lambda v: v.rng.choice(STATUSES), ["{a} is {v}.", "{a} has been marked {v}."]),
    }),
    "company": ("It", {
        "name": ("name company company_name", "string", lambda v: v.ent.company(), ["{v} is a young firm.", "Let me tell you about {v}."]),
        "founded": ("founded year_founded founded_year", "integer", lambda v: v.rng.randint(1850, 2024), ["{a} was founded in {v}.", "{a} started in {v}."]),
        "employees": ("employees headcount staff num_employees", "integer", lambda v: v.rng.randint(2, 90000), ["{a} has {v} employees.", "{a} employs {v} people."]),
        "city": ("city headquarters hq location", "string", lambda v: v.place(), ["{a} is based in {v}.", "{a} has its headquarters in {v}."]),
        "ceo": ("ceo leader chief_executive", "string", lambda v: v.ent.full_name(), ["{a} is led by {v}.", "{v} runs {a}."]),
    }),
}
TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "enum": "str"}
LANGCHAIN_FORMAT = (
    "The output should be formatted as a JSON instance that conforms to the JSON schema below.\n\n"
    'As an example, for the schema {"properties": {"foo": {"title": "Foo", "description": "a list of strings", '
    '"type": "array", "items": {"type": "string"}}}, "required": ["foo"]}\nthe object {"foo": ["bar", "baz"]} is a '
    'well-formatted instance of the schema. The object {"properties": {"foo": ["bar", "baz"]}} is not well-formatted.'
    "\n\nHere is the output schema:\n```\n{schema}\n```")


def json_schema(fields: list[tuple[str, str, object]], titled: bool) -> dict:
    props = {}
    for key, kind, _ in fields:
        spec = {"type": "string", "enum": STATUSES} if kind == "enum" else {"type": kind}
        props[key] = {"title": key.replace("_", " ").title(), **spec} if titled else spec
    return {"type": "object", "properties": props, "required": [k for k, _, _ in fields]}


def _sentence(phrase: str, anchor: str, value) -> str:
    vb = "" if value is True else "not "
    text = phrase.format(a=anchor, v=value, vb=vb)
    return text[0].upper() + text[1:]


def open_json(rng: random.Random, ent: Entities) -> dict:
    vals = Values(rng, ent)
    kind = rng.choice(sorted(RECORDS))
    pronoun, spec = RECORDS[kind]
    meanings = list(spec)
    anchor_m, rest = meanings[0], meanings[1:]
    chosen = [anchor_m] + rng.sample(rest, rng.randint(1, min(4, len(rest))))
    fields, sentences, anchor = [], [], None
    for m in chosen:
        names, kind_t, make, phrases = spec[m]
        value = make(vals)
        fields.append((rng.choice(names.split()), kind_t, value))
        if m == anchor_m:
            anchor = value
            sentences.append(_sentence(rng.choice(phrases), anchor, value))
        else:
            who = pronoun if rng.random() < 0.3 and len(sentences) > 0 else anchor
            sentences.append(_sentence(rng.choice(phrases), who, value))
    if rng.random() < 0.5:          # the anchor first; the other facts in any order
        head, tail = sentences[0], sentences[1:]
        rng.shuffle(tail)
        sentences = [head] + tail
    if len({k for k, _, _ in fields}) < len(fields):       # two meanings drew one key name
        fields = [(f"{m}", t, v) for m, (_, t, v) in zip(chosen, fields)]
    if rng.random() < 0.5:          # the schema's order need not be the text's
        order = [fields[0]] + rng.sample(fields[1:], len(fields) - 1)
        fields = order
    text = " ".join(sentences)
    obj = {k: v for k, _, v in fields}
    schema = json_schema(fields, titled=rng.random() < 0.3)
    return {"messages": json_messages(rng, kind, text, fields, schema), "target": json.dumps(obj, ensure_ascii=False),
            "expected": {"object": obj, "schema": schema}}


def json_messages(rng: random.Random, kind: str, text: str, fields: list[tuple[str, str, object]],
                  schema: dict) -> list[dict]:
    """Ask for ``fields`` (key, type, value) of ``schema`` from ``text`` in one of the ways applications ask."""
    keys = ", ".join(k for k, _, _ in fields)
    style = rng.randrange(8)
    if style == 0:
        return [{"role": "user", "content": f"Extract the following fields as JSON: {keys}.\n\nText: {text}"}]
    if style == 1:
        return [{"role": "system", "content": f"Respond only with a JSON object that matches this JSON schema: {json.dumps(schema)}"},
                {"role": "user", "content": text}]
    if style == 2:
        return [{"role": "user", "content": f"{text}\n\nReturn a JSON object with the keys {keys}."}]
    if style == 3:
        fmt = LANGCHAIN_FORMAT.replace("{schema}", json.dumps(schema))
        return [{"role": "user", "content": f"Extract the {kind} information.\n{fmt}\n{text}"}]
    if style == 4:
        return [{"role": "system", "content": "Extract structured data. Reply with JSON only."},
                {"role": "user", "content": f"Schema: {json.dumps(schema)}\n\n\"\"\"{text}\"\"\""}]
    if style == 5:
        typed = ", ".join(f"{k} ({TYPES[t]})" for k, t, _ in fields)
        return [{"role": "user", "content": f"Convert this into JSON with {typed}: {text}"}]
    if style == 6:
        blank = {k: ({"string": "", "enum": "", "integer": 0, "number": 0, "boolean": False}[t]) for k, t, _ in fields}
        return [{"role": "user", "content": f"Fill in this JSON from the text.\n{json.dumps(blank)}\n\nText: {text}"}]
    return [{"role": "user", "content": f"Text: {text}\n\nGive me a JSON object ({keys}). Only JSON, no prose."}]


# -- chat that remembers ---------------------------------------------------------------------------

FACTS = [("My name is {v}.", "Nice to meet you, {v}!", ["What is my name?", "What's my name?", "Do you remember my name?"],
          "Your name is {v}.", lambda v: v.ent.name()),
         ("I live in {v}.", "{v} sounds lovely.", ["Where do I live?", "Which city do I live in?"], "You live in {v}.",
          lambda v: v.place()),
         ("My favorite color is {v}.", "{v} is a great color.", ["What is my favorite color?", "Which color do I like?"],
          "Your favorite color is {v}.", lambda v: v.rng.choice(COLOURS)),
         ("My dog is called {v}.", "{v} is a nice name for a dog.", ["What is my dog called?", "What's my dog's name?"],
          "Your dog is called {v}.", lambda v: v.ent.name()),
         ("I work at {v}.", "Good to know.", ["Where do I work?", "Which company do I work for?"], "You work at {v}.",
          lambda v: v.ent.company()),
         ("My meeting is at {v}.", "Noted.", ["When is my meeting?", "What time is my meeting?"], "Your meeting is at {v}.",
          lambda v: v.time())]
GREETINGS = [(["hey", "Hi there!", "Hello!", "good evening", "hiya"], "Hello! How can I help you today?"),
             (["How are you?", "how's it going?", "How are you doing today?"], "I'm doing well, thanks! How can I help?"),
             (["What can you do?", "What are you good at?", "How can you help me?"],
              "I can answer questions about documents, call tools and extract data as JSON."),
             (["Thanks a lot!", "thank you", "Cheers, that helps."], "You're welcome!"),
             (["Bye!", "See you.", "Good night!"], "Goodbye! Have a nice day.")]


def open_chat(rng: random.Random, ent: Entities) -> dict:
    """A greeting, or a conversation where the user states facts and later asks one back."""
    vals = Values(rng, ent)
    if rng.random() < 0.3:
        asks, reply = rng.choice(GREETINGS)
        return {"messages": [{"role": "user", "content": rng.choice(asks)}], "target": reply, "expected": {"answers": [reply]}}
    messages, told = [], []
    for tell, ack, asks, answer, make in rng.sample(FACTS, rng.randint(1, 3)):
        v = make(vals)
        told.append((asks, answer, v))
        messages += [{"role": "user", "content": tell.format(v=v)}, {"role": "assistant", "content": ack.format(v=v)}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "You are a friendly assistant."})
    asks, answer, v = rng.choice(told)
    messages.append({"role": "user", "content": rng.choice(asks)})
    return {"messages": messages, "target": answer.format(v=v), "expected": {"answers": [answer.format(v=v)]}}
