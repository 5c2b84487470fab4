"""Tool calls and tool results keyed by open-ended words (see :mod:`open_keys` for why).

A tool's task is a verb (six meanings, 25 verbs) on one of 111 nouns; the distractor tools share
its verb or its noun. In the tool-result family the user asks for one or two attributes composed
from :mod:`open_keys`' pools, the tool returns a record of several, and the reply states the ones
asked for.
"""

from __future__ import annotations

import json
import random

from dlm_tiny.entities import Entities
from dlm_tiny.open_keys import QUESTIONS, draw_key, draw_value
from dlm_tiny.open_tool_frames import Frame, P
from dlm_tiny.open_tools import build_tool, call_example, request_messages, result_turns
from dlm_tiny.open_words import LANGUAGE_NAMES, Values

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
    return call_example(rng, vals, frame, _distracted(rng, verb, noun, tool), names, tool["function"]["name"])


def _distracted(rng: random.Random, verb: str, noun: str, tool: dict) -> list[dict]:
    """``tool`` among 0-3 others that share its verb or its noun, in random order."""
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
    return tools


def keyed_tool_result(rng: random.Random, ent: Entities) -> dict:
    """A lookup returned a record of 2-6 attributes; the reply states the 1-2 the user asked for."""
    vals = Values(rng, ent)
    noun, meaning = rng.choice(NOUNS), rng.choice(["ref", "ref", "person", "city", "date"])
    frame = _frame(rng, "get", noun, [meaning])
    tool, names = build_tool(rng, frame)
    arg = ARGS[meaning][3](vals)
    subject = f"the {noun} " + rng.choice(ARGS[meaning][1]).format(**{meaning: arg})
    record, size = {}, rng.randint(2, 6)
    while len(record) < size:
        k, how = draw_key(rng, ent)
        record.setdefault(k, draw_value(vals, how))
    asked = rng.sample(sorted(record), 1 if rng.random() < 0.75 else 2)
    if len(asked) == 1:
        ask = rng.choice(QUESTIONS).format(s=subject, k=asked[0], K=asked[0].capitalize())
    else:
        ask = f"What are the {asked[0]} and the {asked[1]} of {subject}?"
    answer = " and ".join(f"the {k} is {record[k]}" for k in asked) + "."
    answer = answer[0].upper() + answer[1:]
    result = {k.replace(" ", "_"): v for k, v in record.items()}
    content = json.dumps(result, ensure_ascii=False) if rng.random() < 0.7 else "\n".join(f"{k}: {v}" for k, v in record.items())
    turns = result_turns(rng, tool["function"]["name"], {names[meaning]: arg}, content)
    messages = request_messages(rng, ask[0].upper() + ask[1:]) + turns
    return {"messages": messages, "tools": _distracted(rng, "get", noun, tool), "target": answer,
            "expected": {"answer": answer, "values": [record[k] for k in asked]}}
