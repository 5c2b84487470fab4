"""What users ask tools to do: one frame per task, each with many names, parameter names and phrasings.

A frame is a task (converting currency, tracking an order) and not a tool: every example names the
tool afresh (``get_weather``, ``fetchForecast``, ``WeatherLookup``...), names its parameters afresh
(``location``, ``city``, ``place``...) and writes its description in one framework's style, so the
model must read the tool list to call the tool, and copy the values from the request. ``asks`` hold
{meaning} slots; a slot's value goes into the call under the parameter's drawn name, and optional
parameters are set exactly when the request mentions them. A request may also fix arguments it implies
without a slot (``{"on": False}`` for "turn off").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlm_tiny.open_words import CURRENCY_CODES, LANGUAGE_NAMES, SKIES, STATUSES, TOPICS, Values


@dataclass(frozen=True)
class Param:
    names: tuple[str, ...]
    type: str                       # JSON schema type
    value: object                   # Values -> the argument
    description: str
    enum: tuple = ()


@dataclass(frozen=True)
class Frame:
    names: tuple[tuple[str, str], ...]          # (verb, noun) pairs a tool's name is built from
    descriptions: tuple[str, ...]
    params: dict                                 # meaning -> Param
    required: tuple[str, ...]
    asks: tuple                                  # "text with {meaning}" or (text, fixed arguments)
    result: object = None                        # (Values, args by meaning) -> the tool's JSON result
    answer: str = ""                             # formatted with args and result fields
    extra: dict = field(default_factory=dict)


def P(names: str, type_: str, value, description: str, enum: tuple = ()) -> Param:
    return Param(tuple(names.split()), type_, value, description, enum)


def _num(v: Values) -> float:
    return v.rng.choice([v.rng.randint(1, 5000), round(v.rng.uniform(1, 999), 2)])


CITY = P("location city place city_name", "string", lambda v: v.place(), "The city, e.g. Paris")
FRAMES = [
    Frame((("get", "weather"), ("fetch", "forecast"), ("check", "weather"), ("get", "current_weather"),
           ("weather", "lookup")),
          ("Get the current weather for a location.", "Returns the weather forecast for a city.",
           "Look up current weather conditions."),
          {"location": CITY, "unit": P("unit units temperature_unit", "string", lambda v: v.rng.choice(["celsius", "fahrenheit"]),
                                       "Temperature unit", ("celsius", "fahrenheit"))},
          ("location",),
          ("What's the weather like in {location}?", "weather in {location} pls", "Is it going to rain in {location} today?",
           "How warm is it in {location} right now? Use {unit}.", "Can you check the forecast for {location} in {unit}?",
           "I'm heading to {location} tomorrow, what's the weather there?"),
          lambda v, a: {"temperature": v.rng.randint(-10, 38), "condition": v.rng.choice(SKIES)},
          "It is {temperature} degrees and {condition} in {location}."),
    Frame((("convert", "currency"), ("convert", "money"), ("exchange", "currency"), ("currency", "converter")),
          ("Convert an amount from one currency to another.", "Currency conversion at today's rate."),
          {"amount": P("amount value quantity", "number", _num, "Amount to convert"),
           "source": P("from_currency source_currency from base", "string", lambda v: v.rng.choice(CURRENCY_CODES), "ISO code to convert from"),
           "target": P("to_currency target_currency to quote", "string", lambda v: v.rng.choice(CURRENCY_CODES), "ISO code to convert to")},
          ("amount", "source", "target"),
          ("Convert {amount} {source} to {target}.", "How much is {amount} {source} in {target}?",
           "I have {amount} {source}, what's that in {target}?", "{amount} {source} to {target}?",
           "What would {amount} {source} be in {target} today?"),
          lambda v, a: {"converted": round(float(a["amount"]) * v.rng.uniform(0.1, 9), 2)},
          "{amount} {source} is {converted} {target}."),
    Frame((("search", "flights"), ("find", "flights"), ("flight", "search"), ("get", "flights")),
          ("Search for flights between two cities on a date.", "Find available flights."),
          {"origin": P("origin from_city departure_city source", "string", lambda v: v.place(), "Departure city"),
           "destination": P("destination to_city arrival_city dest", "string", lambda v: v.place(), "Arrival city"),
           "date": P("date departure_date travel_date", "string", lambda v: v.date(), "Date of travel")},
          ("origin", "destination", "date"),
          ("Find me a flight from {origin} to {destination} on {date}.", "Are there flights from {origin} to {destination} on {date}?",
           "I need to fly {origin} to {destination}, {date}.", "Search flights {origin} -> {destination} for {date}."),
          lambda v, a: {"departure": v.time(), "price": v.rng.randint(49, 1400)},
          "The best flight from {origin} to {destination} leaves at {departure} and costs {price}."),
    Frame((("send", "email"), ("send", "mail"), ("email", "send"), ("compose", "email")),
          ("Send an email to a recipient.", "Sends an email message."),
          {"to": P("to recipient email_address recipient_email", "string", lambda v: v.email(), "Recipient email address"),
           "subject": P("subject title subject_line", "string", lambda v: v.rng.choice(
               ["Meeting notes", "Invoice for March", "Lunch on Friday", "Project update", "Quick question", "Welcome aboard"]), "Subject line")},
          ("to", "subject"),
          ('Send an email to {to} with the subject "{subject}".', "Email {to} about {subject}.",
           "Please write to {to}, subject: {subject}", "Can you shoot {to} an email titled {subject}?"),
          lambda v, a: {"status": "sent"}, "Your email to {to} has been sent."),
    Frame((("create", "event"), ("add", "calendar_event"), ("schedule", "meeting"), ("create", "appointment")),
          ("Create a calendar event.", "Schedule a meeting in the user's calendar."),
          {"title": P("title name event_name summary", "string", lambda v: v.rng.choice(
               ["Team sync", "Dentist", "Budget review", "Yoga class", "Call with Sam", "Board meeting"]), "Event title"),
           "date": P("date day event_date", "string", lambda v: v.date(), "Date"),
           "time": P("time start_time at", "string", lambda v: v.time(), "Start time")},
          ("title", "date"),
          ("Schedule {title} on {date} at {time}.", "Add {title} to my calendar for {date}.", 'Put "{title}" on {date}.',
           "Create an event called {title} on {date} at {time}."),
          lambda v, a: {"event_id": v.code("evt_")}, "I added {title} on {date} to your calendar."),
    Frame((("get", "order_status"), ("track", "order"), ("check", "order"), ("order", "lookup")),
          ("Get the status of a customer order.", "Track an order by its id."),
          {"order_id": P("order_id id order_number orderId", "string", lambda v: v.code("A"), "The order id")},
          ("order_id",),
          ("Where is my order {order_id}?", "Track order {order_id}.", "Can you check the status of order #{order_id}?",
           "order {order_id} status?"),
          lambda v, a: {"status": v.rng.choice(STATUSES)}, "Order {order_id} is {status}."),
    Frame((("get", "stock_price"), ("fetch", "quote"), ("get", "share_price"), ("stock", "price")),
          ("Get the latest stock price for a ticker symbol.", "Returns a real-time stock quote."),
          {"symbol": P("symbol ticker stock ticker_symbol", "string", lambda v: v.ent.ticker(), "Ticker symbol")},
          ("symbol",),
          ("What's {symbol} trading at?", "Get me the latest price for {symbol}.", "stock price {symbol}",
           "How is {symbol} doing today?"),
          lambda v, a: {"price": round(v.rng.uniform(2, 900), 2)}, "{symbol} is trading at {price}."),
    Frame((("translate", "text"), ("translate", ""), ("get", "translation")),
          ("Translate text into another language.", "Translates a sentence."),
          {"text": P("text sentence source_text input", "string", lambda v: v.rng.choice(
               ["good morning", "where is the station", "thank you very much", "I would like a coffee", "see you tomorrow"]), "Text to translate"),
           "language": P("target_language language to_language target", "string", lambda v: v.rng.choice(LANGUAGE_NAMES), "Target language")},
          ("text", "language"),
          ('Translate "{text}" into {language}.', 'How do you say "{text}" in {language}?', "Can you put '{text}' in {language}?",
           "{language} for \"{text}\"?"),
          lambda v, a: {"translation": v.ent.name().lower() + " " + v.ent.name().lower()}, "In {language}: {translation}"),
    Frame((("set", "reminder"), ("create", "reminder"), ("add", "reminder"), ("remind", "me")),
          ("Set a reminder for the user.", "Creates a reminder at a given time."),
          {"message": P("message text task note", "string", lambda v: v.rng.choice(
               ["call mom", "buy milk", "water the plants", "pay rent", "take out the trash", "book the dentist"]), "What to remind"),
           "time": P("time when remind_at at", "string", lambda v: v.time(), "When to remind")},
          ("message", "time"),
          ("Remind me to {message} at {time}.", "Set a reminder for {time}: {message}.", "At {time} remind me to {message}.",
           "don't let me forget to {message} at {time}"),
          lambda v, a: {"status": "ok"}, "Done, I will remind you to {message} at {time}."),
    Frame((("set", "timer"), ("start", "timer"), ("timer", "")),
          ("Start a countdown timer.", "Sets a timer for a number of minutes."),
          {"minutes": P("minutes duration_minutes duration", "integer", lambda v: v.rng.randint(1, 90), "Length in minutes")},
          ("minutes",),
          ("Set a timer for {minutes} minutes.", "Start a {minutes} minute timer.", "timer {minutes} min please"),
          lambda v, a: {"status": "running"}, "Your {minutes} minute timer is running."),
    Frame((("book", "hotel"), ("reserve", "room"), ("search", "hotels"), ("hotel", "booking")),
          ("Book a hotel room.", "Reserve accommodation in a city."),
          {"city": CITY, "check_in": P("check_in checkin arrival_date date", "string", lambda v: v.date(), "Check-in date"),
           "guests": P("guests num_guests people adults", "integer", lambda v: v.rng.randint(1, 6), "Number of guests")},
          ("city", "check_in"),
          ("Book a hotel in {city} for {guests} people on {check_in}.", "I need a room in {city} from {check_in}.",
           "Reserve a hotel room in {city}, checking in {check_in}, {guests} guests."),
          lambda v, a: {"confirmation": v.code("H")}, "Your hotel in {city} is booked, confirmation {confirmation}."),
    Frame((("book", "table"), ("make", "reservation"), ("reserve", "table")),
          ("Reserve a table at a restaurant.", "Make a restaurant reservation."),
          {"restaurant": P("restaurant restaurant_name venue", "string", lambda v: f"{v.ent.name()} {v.rng.choice(['Bistro', 'Grill', 'Kitchen', 'Trattoria'])}", "Restaurant"),
           "party_size": P("party_size guests people seats", "integer", lambda v: v.rng.randint(1, 12), "Number of people"),
           "time": P("time reservation_time at", "string", lambda v: v.time(), "Time")},
          ("restaurant", "party_size"),
          ("Book a table for {party_size} at {restaurant}.", "Reserve {restaurant} for {party_size} people at {time}.",
           "Can you get us a table at {restaurant}? We are {party_size}."),
          lambda v, a: {"status": "confirmed"}, "Your table for {party_size} at {restaurant} is confirmed."),
    Frame((("search", "web"), ("web", "search"), ("search", "documents"), ("search", "knowledge_base"), ("search", "")),
          ("Search the web for a query.", "Search internal documents.", "Full-text search over the knowledge base."),
          {"query": P("query q search_query search_term", "string", lambda v: v.rng.choice(
               ["cheap flights to " + v.place(), "best pizza in " + v.place(), "python list comprehension",
                "refund policy", "history of " + v.place(), v.ent.company() + " reviews"]), "Search query"),
           "limit": P("limit max_results top_k num_results", "integer", lambda v: v.rng.randint(1, 20), "How many results")},
          ("query",),
          ("Search for {query}.", "Look up {query}.", "Find {limit} results about {query}.", "Can you google {query}?",
           "search: {query}"),
          lambda v, a: {"top_result": v.ent.company() + " article"}, "The top result is {top_result}."),
    Frame((("get", "customer"), ("lookup", "user"), ("find", "customer"), ("get", "user_info")),
          ("Look up a customer record.", "Fetch a user's account details."),
          {"email": P("email customer_email user_email", "string", lambda v: v.email(), "The customer's email")},
          ("email",),
          ("Look up the customer with email {email}.", "Find the account for {email}.", "Who is {email}?",
           "Pull up the user {email}."),
          lambda v, a: {"name": v.ent.full_name(), "plan": v.rng.choice(["free", "pro", "team", "enterprise"])},
          "{email} belongs to {name}, on the {plan} plan."),
    Frame((("calculate", "tip"), ("tip", "calculator"), ("compute", "tip")),
          ("Calculate a tip for a bill.", "Compute the tip amount."),
          {"bill": P("bill_amount bill total amount", "number", _num, "Bill total"),
           "percent": P("tip_percent percentage percent rate", "number", lambda v: v.rng.choice([10, 12, 15, 18, 20, 25]), "Tip percentage")},
          ("bill", "percent"),
          ("What's a {percent}% tip on {bill}?", "Calculate the tip for a bill of {bill} at {percent} percent.",
           "tip {percent}% of {bill}"),
          lambda v, a: {"tip": round(float(a["bill"]) * float(a["percent"]) / 100, 2)}, "The tip is {tip}."),
    Frame((("convert", "units"), ("unit", "converter"), ("convert", "measurement")),
          ("Convert a value between units.", "Unit conversion."),
          {"value": P("value amount quantity", "number", _num, "The value"),
           "from_unit": P("from_unit source_unit unit_from", "string", lambda v: v.rng.choice(["km", "miles", "kg", "pounds", "liters", "gallons"]), "Unit to convert from"),
           "to_unit": P("to_unit target_unit unit_to", "string", lambda v: v.rng.choice(["meters", "feet", "grams", "ounces", "cups", "inches"]), "Unit to convert to")},
          ("value", "from_unit", "to_unit"),
          ("Convert {value} {from_unit} to {to_unit}.", "How many {to_unit} is {value} {from_unit}?",
           "{value} {from_unit} in {to_unit}?"),
          lambda v, a: {"result": round(float(a["value"]) * v.rng.uniform(0.1, 50), 2)}, "{value} {from_unit} is {result} {to_unit}."),
    Frame((("play", "song"), ("play", "music"), ("music", "play")),
          ("Play a song.", "Start playing music."),
          {"title": P("song title track song_name", "string", lambda v: v.title(), "Song title"),
           "artist": P("artist singer band", "string", lambda v: v.person(), "Artist")},
          ("title",),
          ("Play {title} by {artist}.", "Put on {title}.", "I want to hear {title} by {artist}."),
          lambda v, a: {"status": "playing"}, "Now playing {title}."),
    Frame((("get", "news"), ("fetch", "headlines"), ("news", "search")),
          ("Get the latest news headlines on a topic.", "Fetch news articles."),
          {"topic": P("topic query subject category", "string", lambda v: v.rng.choice(
               ["technology", "football", "the economy", "climate", "space", "elections", v.place()]), "News topic"),
           "count": P("count limit num_articles n", "integer", lambda v: v.rng.randint(1, 10), "How many headlines")},
          ("topic",),
          ("What's the latest news about {topic}?", "Give me {count} headlines on {topic}.", "news on {topic}"),
          lambda v, a: {"headline": v.title() + " shakes up " + str(a["topic"])}, "Top headline: {headline}."),
    Frame((("add", "todo"), ("create", "task"), ("add", "note"), ("todo", "add")),
          ("Add an item to the to-do list.", "Create a task."),
          {"task": P("task text item title", "string", lambda v: v.rng.choice(
               ["renew passport", "call the plumber", "send the report", "buy a birthday gift", "clean the garage"]), "The task"),
           "due": P("due_date due deadline", "string", lambda v: v.date(), "Due date")},
          ("task",),
          ('Add "{task}" to my to-do list.', "Create a task to {task}, due {due}.", "new todo: {task}"),
          lambda v, a: {"status": "added"}, 'I added "{task}" to your list.'),
    Frame((("get", "distance"), ("calculate", "distance"), ("route", "distance")),
          ("Get the travel distance between two places.", "Distance between two cities."),
          {"origin": P("origin start from_place", "string", lambda v: v.place(), "Start"),
           "destination": P("destination end to_place", "string", lambda v: v.place(), "End"),
           "mode": P("mode travel_mode transport", "string", lambda v: v.rng.choice(["driving", "walking", "cycling"]),
                     "How to travel", ("driving", "walking", "cycling"))},
          ("origin", "destination"),
          ("How far is {origin} from {destination}?", "Distance from {origin} to {destination} by {mode}?",
           "How long is the trip from {origin} to {destination} when {mode}?"),
          lambda v, a: {"km": v.rng.randint(2, 2000)}, "It is {km} km from {origin} to {destination}."),
    Frame((("set", "lights"), ("control", "light"), ("toggle", "lights"), ("lights", "")),
          ("Turn lights on or off in a room.", "Control the smart lights."),
          {"room": P("room location area", "string", lambda v: v.rng.choice(["kitchen", "bedroom", "living room", "office", "garage"]), "Room"),
           "on": P("on turn_on state_on", "boolean", lambda v: True, "True to switch on")},
          ("room", "on"),
          (("Turn on the lights in the {room}.", {"on": True}), ("Switch off the {room} lights.", {"on": False}),
           ("lights off in the {room} please", {"on": False}), ("Can you turn the {room} light on?", {"on": True})),
          lambda v, a: {"status": "ok"}, "Done, the {room} lights are updated."),
    Frame((("get", "definition"), ("define", "word"), ("dictionary", "lookup")),
          ("Look up the definition of a word.", "Dictionary lookup."),
          {"word": P("word term query", "string", lambda v: v.rng.choice(
               ["serendipity", "ephemeral", "ubiquitous", "quorum", "latency", "gist", "verbose"]), "The word")},
          ("word",),
          ("What does {word} mean?", "Define {word}.", "look up the word {word}"),
          lambda v, a: {"definition": "a " + v.rng.choice(TOPICS)}, "{word} means {definition}."),
]
