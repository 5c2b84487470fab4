"""The short families: arithmetic, list tasks, chit-chat, and copy practice (training only)."""

from __future__ import annotations

import random

from dlm_tiny.entities import CATEGORIES, WORDS, Entities
from dlm_tiny.example import Example
from dlm_tiny.open_words import IDENTITY


def arithmetic(rng: random.Random, ent: Entities) -> Example:
    op = rng.choice(["+", "-", "*"])
    a, b = (rng.randint(0, 50), rng.randint(0, 50)) if op != "*" else (rng.randint(0, 12), rng.randint(0, 12))
    if op == "-" and b > a:
        a, b = b, a
    word = {"+": rng.choice(["plus", "+"]), "-": rng.choice(["minus", "-"]), "*": rng.choice(["times", "*", "multiplied by"])}[op]
    ask = rng.choice(["What is {a} {w} {b}?", "Compute {a} {w} {b}.", "{a} {w} {b} = ?", "Calculate {a} {w} {b}."])
    answer = str(eval(f"{a} {op} {b}"))  # noqa: S307 - two small integers and an operator
    return Example("arithmetic", [{"role": "user", "content": ask.format(a=a, w=word, b=b)}], answer,
                   expected={"answer": answer})


def list_task(rng: random.Random, ent: Entities) -> Example:
    kind = rng.randrange(5)
    if kind in (0, 1):
        nums = rng.sample(range(100), rng.randint(3, 6))
        desc = kind == 1
        ask = rng.choice(["Sort these numbers{d}: {x}", "Put in {o} order: {x}", "Order {x}{d}."]).format(
            d=" in descending order" if desc else "", o="descending" if desc else "ascending",
            x=", ".join(map(str, nums)))
        answer = ", ".join(map(str, sorted(nums, reverse=desc)))
    elif kind == 2:
        items = rng.sample(WORDS, rng.randint(3, 6))
        ask = rng.choice(["Reverse this list: {x}", "Write these in reverse order: {x}"]).format(x=", ".join(items))
        answer = ", ".join(reversed(items))
    elif kind == 3:
        items = rng.sample(WORDS, rng.randint(2, 8))
        ask = rng.choice(["How many items are in this list: {x}?", "Count the words: {x}"]).format(x=", ".join(items))
        answer = str(len(items))
    else:
        cat = rng.choice(sorted(CATEGORIES))
        n = rng.randint(2, min(5, len(CATEGORIES[cat])))
        ask = rng.choice(["List exactly {n} {c}.", "Name {n} {c}.", "Give me {n} {c}, comma separated."]).format(n=n, c=cat)
        answer = ", ".join(rng.sample(CATEGORIES[cat], n))
        return Example("list", [{"role": "user", "content": ask}], answer, expected={"category": cat, "count": n})
    return Example("list", [{"role": "user", "content": ask}], answer, expected={"answer": answer})


CHAT = [
    (["Hi!", "Hello", "hey there", "Good morning!", "Hi, how are you?"],
     ["Hello! How can I help you today?", "Hi! What can I do for you?"]),
    (["Who are you?", "What are you?", "What is your name?", "Introduce yourself."], [IDENTITY]),
    (["Thanks!", "Thank you so much.", "thx"], ["You're welcome!", "Happy to help!"]),
    (["Bye", "Goodbye!", "See you later."], ["Goodbye! Have a nice day.", "Bye! Take care."]),
]


def chat(rng: random.Random, ent: Entities) -> Example:
    asks, answers = rng.choice(CHAT)
    answer = rng.choice(answers)
    return Example("chat", [{"role": "user", "content": rng.choice(asks)}], answer, expected={"answers": answers})


COPY_ASKS = ["Repeat after me: {x}", "Copy this exactly: {x}", "Say {x}.", "Echo: {x}", "Write {x}.",
             "Please repeat: {x}"]
PICK_ASKS = [("I met {x} yesterday.", "Which name is in this sentence: {s}"),
             ("The train to {x} leaves at noon.", "Which place is mentioned here? {s}"),
             ("Send it to {x} today.", "Extract the recipient: {s}"),
             ("Our guest tonight is {x}.", "Who is the guest? {s}")]


def copy_task(rng: random.Random, ent: Entities) -> Example:
    """Copy practice: every token of the reply is an unseen name or value taken from the prompt.

    Every other family needs this skill for a few tokens per reply (the city in a tool call, the
    answer in a context). Before the built copy circuits no run learned it from data: with this
    family at 15% of the mix run 6 still copied 0/20 (findings.md). The recipe keeps it as practice,
    at 0.05 in its last stage.
    """
    draw = [ent.name, ent.city, ent.foreign, ent.email, ent.ticker, ent.full_name, ent.company,
            lambda: str(rng.randint(0, 99999))]
    if rng.random() < 0.6:
        x = " ".join(rng.choice(draw)() for _ in range(rng.randint(1, 4)))
        ask = rng.choice(COPY_ASKS).format(x=x)
    else:
        x = rng.choice(draw[:4])()
        sentence, question = rng.choice(PICK_ASKS)
        ask = question.format(s=sentence.format(x=x))
    return Example("copy", [{"role": "user", "content": ask}], x, expected={"answer": x})
