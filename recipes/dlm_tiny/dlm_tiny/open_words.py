"""Word pools for the open-ended families (:mod:`open_qa`, :mod:`open_tools`, :mod:`open_json`).

The first corpus taught seven person attributes, twelve tools and four JSON schemas, and the model
learned those templates rather than the tasks: on prompts written the way applications write them it
refused or garbled most answers (issue "robust dlm-tiny"). These pools are broad on purpose: many
kinds of subject, relation, tool and field, so that no single surface form can be memorised and the
model has to find the answer in the prompt. Proper names still come from :class:`entities.Entities`,
so the training and held-out entity split holds here too.
"""

from __future__ import annotations

import random

from dlm_tiny.entities import Entities, MONTHS, WEEKDAYS

IDENTITY = "I am dlm-tiny, a small diffusion language model."   # who the model says it is

#: kinds of subject a passage can be about, and the nouns that name one
KINDS = {
    "structure": ["lighthouse", "bridge", "tower", "museum", "library", "castle", "station", "stadium", "theatre",
                  "church", "hotel", "school", "hospital", "mill", "observatory", "market hall", "gallery"],
    "org": ["company", "bakery", "cafe", "bookshop", "brewery", "studio", "startup", "club", "band", "orchestra",
            "charity", "agency", "restaurant", "clinic", "garage", "workshop"],
    "place": ["village", "town", "island", "lake", "river", "valley", "park", "mountain", "forest", "bay"],
    "product": ["laptop", "phone", "bicycle", "camera", "kettle", "drone", "watch", "headphones", "tablet",
                "backpack", "scooter", "blender", "speaker", "printer"],
    "event": ["festival", "marathon", "conference", "fair", "concert", "tournament", "exhibition", "market",
              "parade", "workshop series"],
    "work": ["novel", "film", "album", "song", "painting", "play", "podcast", "board game", "poem", "opera"],
}
MATERIALS = ["stone", "brick", "wood", "steel", "glass", "granite", "marble", "concrete", "oak", "copper"]
COLOURS = ["red", "blue", "green", "white", "black", "yellow", "grey", "orange", "purple", "silver", "teal"]
TOPICS = ["a lost dog", "two sisters", "a sea voyage", "a small bakery", "the first moon landing", "a chess player",
          "a haunted house", "an old lighthouse keeper", "a robot learning to paint", "a summer in the mountains"]
FILLERS = [
    "It is popular with visitors.", "Locals speak highly of it.", "It has changed a lot over the years.",
    "Many people have never heard of it.", "It appears in several guidebooks.", "The area around it is quiet.",
    "It was renovated more than once.", "Photos of it are often shared online.", "It is easy to reach by bus.",
    "Opinions about it differ.", "It is mentioned in a few local stories.", "The weather there is often mild.",
    "Tickets are sold at the entrance.", "Some say it is overrated.", "It gets busy in the summer.",
]
UNITS_LENGTH = ["metres", "meters", "feet", "kilometres", "km", "miles"]
CURRENCY_WORDS = [("dollars", "$"), ("euros", "€"), ("pounds", "£")]
CURRENCY_CODES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "INR", "MXN", "BRL", "PLN"]
LANGUAGE_NAMES = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Japanese", "Korean",
                  "Polish", "Greek", "Turkish", "Swedish", "Finnish", "Czech"]
TITLE_WORDS = ["Silent", "Golden", "Last", "Hidden", "Broken", "Northern", "Paper", "Glass", "Winter", "Little",
               "Electric", "Wild", "Blue", "Second", "Quiet", "Iron", "Velvet", "Distant"]
TITLE_NOUNS = ["Harbor", "Garden", "Letters", "Road", "Season", "River", "Machine", "Orchard", "Signal", "Lantern",
               "Kingdom", "Promise", "Window", "Compass", "Echo", "Tide", "Station", "Summer"]
STATUSES = ["shipped", "pending", "delivered", "cancelled", "processing", "on hold"]
SKIES = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear", "stormy", "overcast"]
STREET_KINDS = ["Street", "Road", "Avenue", "Lane", "Square", "Way"]


class Values:
    """Values of every kind the open families need, drawn from one rng and one entity split."""

    def __init__(self, rng: random.Random, ent: Entities):
        self.rng, self.ent = rng, ent

    def year(self) -> str:
        return str(self.rng.randint(1650, 2024))

    def count(self, lo: int = 2, hi: int = 5000) -> str:
        return str(self.rng.randint(lo, hi))

    def big(self) -> str:
        """A large number written as people write it: 12400, 12,400 or 1.2 million."""
        n = self.rng.randint(1000, 2_000_000)
        style = self.rng.randrange(3)
        return f"{n:,}" if style == 0 else (str(n) if style == 1 else f"{round(n / 1e6, 1)} million" if n > 1e6 else str(n))

    def price(self) -> tuple[str, float]:
        amount = self.rng.choice([self.rng.randint(2, 2000), round(self.rng.uniform(1, 999), 2)])
        word, sign = self.rng.choice(CURRENCY_WORDS)
        return (f"{sign}{amount}" if self.rng.random() < 0.5 else f"{amount} {word}"), amount

    def date(self) -> str:
        month, day = self.rng.choice(MONTHS), self.rng.randint(1, 28)
        style = self.rng.randrange(4)
        if style == 0:
            return f"{month} {day}"
        if style == 1:
            return f"{day} {month}"
        if style == 2:
            return f"{month} {day}, {self.rng.randint(2020, 2027)}"
        return f"{self.rng.randint(2020, 2027)}-{MONTHS.index(month) + 1:02d}-{day:02d}"

    def weekday(self) -> str:
        return self.rng.choice(WEEKDAYS)

    def time(self) -> str:
        if self.rng.random() < 0.5:
            return f"{self.rng.randint(0, 23):02d}:{self.rng.choice(['00', '15', '30', '45'])}"
        return self.ent.time()

    def person(self) -> str:
        return self.ent.full_name() if self.rng.random() < 0.6 else self.ent.name()

    def place(self) -> str:
        return self.ent.city() if self.rng.random() < 0.75 else self.ent.foreign()

    def street(self) -> str:
        return f"{self.rng.randint(1, 250)} {self.ent.name()} {self.rng.choice(STREET_KINDS)}"

    def title(self) -> str:
        first = self.rng.choice(TITLE_WORDS)
        return f"The {first} {self.rng.choice(TITLE_NOUNS)}" if self.rng.random() < 0.6 else \
            f"{first} {self.rng.choice(TITLE_NOUNS)}"

    def subject(self, kind: str) -> str:
        """A named subject of ``kind``: "the Orvel lighthouse", "Brindle Bakery", "Lake Tomsa"."""
        noun, name = self.rng.choice(KINDS[kind]), self.ent.name()
        if kind == "work":
            return f'"{self.title()}"' if self.rng.random() < 0.5 else self.title()
        if kind == "place":      # how places are named: Lake Tomsa, Mount Orvel, the Kesta River
            return {"lake": f"Lake {name}", "mountain": f"Mount {name}", "river": f"the {name} River",
                    "island": f"{name} Island", "bay": f"{name} Bay"}.get(noun, f"{name} {noun.title()}")
        style = self.rng.randrange(3)
        if style == 0:
            return f"the {name} {noun}"
        if style == 1:
            return f"{name} {noun.title()}"
        return f"the {noun} {name}" if kind != "org" else f"{name} {noun.title()}"

    def email(self) -> str:
        return self.ent.email()

    def phone(self) -> str:
        return f"+{self.rng.randint(1, 49)} {self.rng.randint(100, 999)} {self.rng.randint(100, 999)} {self.rng.randint(1000, 9999)}"

    def code(self, prefix: str = "") -> str:
        letters = "".join(self.rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(self.rng.randint(0, 3)))
        return f"{prefix}{letters}{self.rng.randint(100, 99999)}"
