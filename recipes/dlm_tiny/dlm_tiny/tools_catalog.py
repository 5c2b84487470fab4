"""Tools the corpus teaches the model to call: OpenAI-style schemas, request phrasings, results."""

from __future__ import annotations

import random

from dlm_tiny.entities import CURRENCIES, LANGUAGES, WEATHER, Entities


def _fn(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


def _s(desc: str) -> dict:
    return {"type": "string", "description": desc}


def _n(desc: str) -> dict:
    return {"type": "number", "description": desc}


SCHEMAS = {
    "get_weather": _fn("get_weather", "Get the current weather in a city", {"city": _s("City name")}, ["city"]),
    "get_time": _fn("get_time", "Get the local time in a city", {"city": _s("City name")}, ["city"]),
    "search_web": _fn("search_web", "Search the web", {"query": _s("Search query")}, ["query"]),
    "send_email": _fn("send_email", "Send an email", {"to": _s("Recipient address"), "subject": _s("Subject")},
                      ["to", "subject"]),
    "calculator": _fn("calculator", "Evaluate an arithmetic expression", {"expression": _s("Expression")},
                      ["expression"]),
    "get_stock_price": _fn("get_stock_price", "Get the latest price of a stock", {"symbol": _s("Ticker")},
                           ["symbol"]),
    "convert_currency": _fn("convert_currency", "Convert money between currencies",
                            {"amount": _n("Amount"), "from_currency": _s("From"), "to_currency": _s("To")},
                            ["amount", "from_currency", "to_currency"]),
    "set_reminder": _fn("set_reminder", "Set a reminder", {"text": _s("What to remember"), "time": _s("When")},
                        ["text", "time"]),
    "lookup_user": _fn("lookup_user", "Find a user by name", {"name": _s("Full name")}, ["name"]),
    "translate": _fn("translate", "Translate text", {"text": _s("Text"), "language": _s("Target language")},
                     ["text", "language"]),
    "get_population": _fn("get_population", "Get the population of a city", {"city": _s("City name")}, ["city"]),
    "book_table": _fn("book_table", "Book a restaurant table",
                      {"restaurant": _s("Restaurant"), "people": _n("Party size")}, ["restaurant", "people"]),
}


def make_call(name: str, rng: random.Random, ent: Entities) -> tuple[dict, str, str, str]:
    """(arguments, user request, tool result, final answer) for one call of ``name``."""
    r = rng.choice
    if name == "get_weather":
        city = ent.city()
        deg, sky = rng.randint(-5, 35), r(WEATHER)
        ask = r([f"What's the weather in {city}?", f"How is the weather in {city} right now?",
                 f"Is it cold in {city} today?", f"weather {city}", f"Tell me the weather for {city}."])
        return {"city": city}, ask, f'{{"temperature": {deg}, "sky": "{sky}"}}', f"It is {deg} degrees and {sky} in {city}."
    if name == "get_time":
        city, t = ent.city(), ent.time()
        ask = r([f"What time is it in {city}?", f"Current time in {city}?", f"Tell me the local time in {city}."])
        return {"city": city}, ask, f'{{"time": "{t}"}}', f"It is {t} in {city}."
    if name == "search_web":
        q = f"{ent.name()} {r(['biography', 'news', 'recipes', 'reviews', 'history', 'tickets'])}"
        ask = r([f"Search the web for {q}.", f"Look up {q} online.", f"Can you find {q}?", f"search: {q}"])
        top = f"{ent.company()} article"
        return {"query": q}, ask, f'{{"top_result": "{top}"}}', f"The top result is {top}."
    if name == "send_email":
        to, subject = ent.email(), f"{r(['Meeting', 'Invoice', 'Party', 'Report', 'Trip'])} on {ent.date()}"
        ask = r([f"Send an email to {to} with the subject {subject}.", f"Email {to} about {subject}.",
                 f"Please write to {to}, subject: {subject}."])
        return {"to": to, "subject": subject}, ask, '{"status": "sent"}', f"The email to {to} was sent."
    if name == "calculator":
        a, b, op = rng.randint(10, 999), rng.randint(2, 99), r(["+", "-", "*"])
        expr = f"{a} {op} {b}"
        value = eval(expr)  # noqa: S307 - two integers and one operator built above
        ask = r([f"Use the calculator to compute {expr}.", f"Calculate {expr} with the calculator tool.",
                 f"What is {expr}? Use the calculator."])
        return {"expression": expr}, ask, f'{{"result": {value}}}', f"{expr} = {value}."
    if name == "get_stock_price":
        sym, price = ent.ticker(), f"{rng.randint(5, 900)}.{rng.randint(10, 99)}"
        ask = r([f"What is the stock price of {sym}?", f"How much is {sym} trading at?", f"Price of {sym} stock?"])
        return {"symbol": sym}, ask, f'{{"price": {price}}}', f"{sym} is trading at {price}."
    if name == "convert_currency":
        amount, a, b = rng.randint(1, 5000), r(CURRENCIES), r(CURRENCIES)
        value = round(amount * rng.uniform(0.2, 3.0), 2)
        ask = r([f"Convert {amount} {a} to {b}.", f"How much is {amount} {a} in {b}?",
                 f"I need {amount} {a} converted into {b}."])
        return ({"amount": amount, "from_currency": a, "to_currency": b}, ask, f'{{"result": {value}}}',
                f"{amount} {a} is {value} {b}.")
    if name == "set_reminder":
        text, t = f"call {ent.name()}", ent.time()
        ask = r([f"Remind me to {text} at {t}.", f"Set a reminder to {text} at {t}.", f"At {t}, remind me to {text}."])
        return {"text": text, "time": t}, ask, '{"status": "ok"}', f"I set a reminder to {text} at {t}."
    if name == "lookup_user":
        who, mail = ent.full_name(), ent.email()
        ask = r([f"Find the user {who}.", f"Look up the account of {who}.", f"Who is {who} in our system?"])
        return {"name": who}, ask, f'{{"email": "{mail}"}}', f"The email of {who} is {mail}."
    if name == "translate":
        text, lang = f"the {ent.word()} is {r(['big', 'small', 'old', 'new', 'red'])}", r(LANGUAGES)
        out = ent.name().lower() + " " + ent.name().lower()
        ask = r([f"Translate '{text}' into {lang}.", f"How do you say '{text}' in {lang}?",
                 f"Please translate '{text}' to {lang}."])
        return {"text": text, "language": lang}, ask, f'{{"translation": "{out}"}}', f"In {lang}: {out}."
    if name == "get_population":
        city, pop = ent.city(), rng.randint(1000, 9000000)
        ask = r([f"What is the population of {city}?", f"How many people live in {city}?"])
        return {"city": city}, ask, f'{{"population": {pop}}}', f"{city} has {pop} people."
    assert name == "book_table", name
    place, people = f"{ent.name()} {r(['Bistro', 'Grill', 'Cafe', 'Kitchen'])}", rng.randint(1, 12)
    ask = r([f"Book a table for {people} at {place}.", f"Reserve {place} for {people} people.",
             f"Can you get us a table at {place}? We are {people}."])
    return {"restaurant": place, "people": people}, ask, '{"status": "booked"}', f"Your table for {people} at {place} is booked."
