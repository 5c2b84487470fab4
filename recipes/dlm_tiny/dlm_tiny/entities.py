"""Names, places and values for the synthetic corpus, split so evaluation never sees training entities.

Names and places are built from syllables; whether an entity belongs to the training or the
held-out split is decided by a hash of its text, so the two splits are disjoint by construction
while sharing the same surface statistics (and BPE pieces).
"""

from __future__ import annotations

import random
import zlib

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr",
          "st", "tr", "sh", "ch", "th", "h", "j", "w"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
CODAS = ["", "", "", "n", "r", "l", "s", "m", "th", "x"]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown", "gray",
          "silver", "gold", "teal", "violet", "indigo", "maroon", "beige"]
JOBS = ["teacher", "engineer", "doctor", "pilot", "chef", "painter", "lawyer", "farmer", "nurse", "writer",
        "baker", "architect", "dentist", "plumber", "musician", "librarian", "pharmacist", "designer"]
ANIMALS = ["cat", "dog", "horse", "rabbit", "parrot", "turtle", "goat", "fox", "owl", "hamster", "lizard",
           "pig", "duck", "cow", "sheep", "frog", "bear", "wolf"]
FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "pear", "plum", "kiwi", "melon",
          "orange", "lime", "apricot", "fig", "papaya"]
SPORTS = ["tennis", "soccer", "chess", "golf", "rugby", "hockey", "cycling", "rowing", "boxing", "skiing",
          "swimming", "karate", "archery", "fencing"]
WEATHER = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "stormy", "clear"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR", "CNY", "SEK", "NOK", "BRL"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Japanese", "Dutch", "Polish", "Greek", "Turkish",
             "Korean", "Swedish", "Hindi"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
WORDS = ["river", "stone", "cloud", "garden", "window", "forest", "candle", "bridge", "mirror", "ladder",
         "anchor", "basket", "button", "castle", "desert", "engine", "feather", "glacier", "harbor", "island",
         "jacket", "kettle", "lantern", "meadow", "needle", "ocean", "pencil", "quartz", "rocket", "saddle",
         "tunnel", "umbrella", "valley", "wagon", "yarn", "zipper"]
CATEGORIES = {"colors": COLORS, "animals": ANIMALS, "fruits": FRUITS, "sports": SPORTS, "jobs": JOBS,
              "languages": LANGUAGES, "weekdays": WEEKDAYS, "months": MONTHS}


def _split(text: str) -> str:
    return "eval" if zlib.crc32(text.encode()) % 5 == 0 else "train"


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables))


class Entities:
    """Draws entities of one split ("train" or "eval")."""

    def __init__(self, rng: random.Random, split: str):
        self.rng, self.split = rng, split

    def _draw(self, make) -> str:
        while True:
            value = make()
            if _split(value) == self.split:
                return value

    def name(self) -> str:
        return self._draw(lambda: _word(self.rng, self.rng.choice([2, 2, 3])).capitalize())

    def full_name(self) -> str:
        return f"{self.name()} {self.name()}"

    def city(self) -> str:
        return self._draw(lambda: (_word(self.rng, self.rng.choice([2, 3])) + self.rng.choice(
            ["", "", "ville", "burg", "ton", "port", "field"])).capitalize())

    def company(self) -> str:
        return self._draw(lambda: _word(self.rng, 2).capitalize() + self.rng.choice(
            [" Labs", " Systems", " Foods", " Motors", " Media", " Bank", " Health", ""]))

    def product(self) -> str:
        return self._draw(lambda: _word(self.rng, 2).capitalize() + " " + self.rng.choice(
            ["Pro", "Max", "Mini", "One", "Air", "Plus", "X", "Go"]))

    def ticker(self) -> str:
        return self._draw(lambda: "".join(self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
                                          for _ in range(self.rng.choice([3, 4]))))

    def email(self) -> str:
        return self._draw(lambda: f"{_word(self.rng, 2)}@{_word(self.rng, 2)}.{self.rng.choice(['com', 'org', 'net', 'io'])}")

    def date(self) -> str:
        return f"{self.rng.choice(MONTHS)} {self.rng.randint(1, 28)}"

    def time(self) -> str:
        return f"{self.rng.randint(1, 12)}:{self.rng.choice(['00', '15', '30', '45'])} {self.rng.choice(['am', 'pm'])}"

    def word(self) -> str:
        return self.rng.choice(WORDS)

    def foreign(self) -> str:
        """A capitalised string of random letters: BPE pieces the syllable names never produce
        (real names such as Kyoto or Oslo look like this to the tokenizer)."""
        return self._draw(lambda: "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz")
                                          for _ in range(self.rng.randint(3, 9))).capitalize())
