"""Structured output one value at a time: keys fixed, each value written by the model until it closes.

A fixed-size value slot cuts long values (a number slot of 3 tokens kept 2 digits of " 573") and
makes short ones pad, which no model saw in training. Here the answer's JSON text so far is the
response template of one generation per value, and the model writes the value after it freely; the
engine ends the generation at the value's closing delimiter (a stop string: the closing quote of a string, or the
``,`` / ``}`` / ``]`` / newline after a number), so a value is as long as the model makes it. A
string that has not closed when its generation runs out of room grows by another one, up to
:data:`STRING_LIMIT` tokens; one closed by an escaped quote goes on. Each value is then read as its
type (a number as a number, an enum as its nearest option) and written into the answer with
``json.dumps``, so the answer always parses, has the schema's keys in order, and its streamed
prefix is always a prefix of the final text.

Where a value's fixed text ends is decided by the model's tokenizer: the template stops at a token
boundary of ``"key": <value>`` as the tokenizer splits it, so the model writes the value with the
tokens it would write unconstrained (``" 573"`` after ``":`` where the space joins the digits, or
``"573"`` after ``": "`` where it does not).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Generator

from dlm_backend.chat.structured import nearest, scalar, slot_kind

STRING_CHUNK = 32        # free slots a string's generation has before it grows (tokens)
STRING_LIMIT = 512       # the longest string value written, in tokens; longer is cut there
NUMBER_ROOM = 24         # free slots for a number, a boolean or an enum's number: "-12345678901234567890e-10" fits
ARRAY_ROOM = 128         # free slots for an array of scalars
_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
#: what ends a bare value (a number, a boolean) in JSON text the model writes
BARE_STOPS = [",", "}", "]", "\n"]
SAMPLES = {"string": '"x"', "integer": "5", "number": "5", "boolean": "true", "enum": "5", "array": "[5"}


@dataclass(frozen=True)
class ValueStep:
    """One value's generation: the answer so far as fixed tokens, room for the value after it, where it ends."""

    template: list[int]
    room: int
    stop: list[str]


@dataclass(frozen=True)
class Written:
    """What the model wrote after a step's template (cut before the stop string), and why it ended:
    ``stop`` is the stop string it reached, None when it ran out of room or wrote an end token."""

    text: str
    stop: str | None
    out_of_room: bool = False


class JsonWriter:
    """Writes ``head`` + the object for a templatable ``schema`` + ``tail``, a value a generation, within
    ``max_tokens`` tokens for the whole answer.

    :meth:`steps` is a generator: it yields :class:`ValueStep` s and receives :class:`Written` s;
    afterwards :attr:`value` is the object and :attr:`text` its JSON (``json.dumps`` of it).
    :attr:`settled` is the answer's text decided so far (``head`` first), for streaming; values the
    answer has no room left for take their type's empty value and :attr:`cut` says so.
    """

    def __init__(self, tokenizer, schema: dict, max_tokens: int, head: str = "", tail: str = ""):
        self.tokenizer, self.schema, self.max_tokens, self.head, self.tail = tokenizer, schema, max_tokens, head, tail
        self.settled = head
        self.value: dict | None = None
        self.cut = False
        self.depth = 0                                  # objects open at the current value
        # What must still fit after a value: its closing quote, a brace per open object, the tail.
        self._tail_tokens = len(tokenizer.encode(tail)) if tail else 0

    @property
    def text(self) -> str:
        """The object's JSON text (without ``head`` and ``tail``)."""
        return self.settled[len(self.head):len(self.settled) - (len(self.tail) if self.value is not None else 0)]

    def steps(self) -> Generator[ValueStep, Written, None]:
        value = yield from self._object(self.schema)
        self.settled += self.tail
        self.value = value

    def _object(self, schema: dict) -> Generator[ValueStep, Written, dict]:
        out: dict = {}
        self.depth += 1
        for i, (key, prop) in enumerate(schema["properties"].items()):
            self.settled += ("{" if i == 0 else ", ") + json.dumps(key, ensure_ascii=False) + ": "
            out[key] = yield from self._value(scalar(prop))
        self.depth -= 1
        self.settled += "}" if out else "{}"
        return out

    def _value(self, prop: dict) -> Generator[ValueStep, Written, object]:
        kind = slot_kind(prop)
        if kind == "object":
            return (yield from self._object(prop))
        if kind == "const":
            value = prop["const"]
        elif kind == "null":
            value = None
        elif kind == "string":
            value = yield from self._string()
            if isinstance(prop.get("enum"), list):
                value = nearest(prop["enum"], value)
        elif kind == "array":
            value = yield from self._array()
        else:
            value = yield from self._bare(kind, prop)
        self.settled += json.dumps(value, ensure_ascii=False)
        return value

    # -- the generations -------------------------------------------------------------------------

    def _step(self, room: int, stop: list[str], sample: str | None = None, written: str = "") -> ValueStep | None:
        """The answer so far (and ``written``: the value's part already decided) as fixed tokens, cut
        at the token boundary where the tokenizer's split of ``sample`` after it begins; None when the
        answer has no room left."""
        cut = self._boundary(sample) if sample is not None else len(self.settled)
        template = self.tokenizer.encode(self.settled[:cut] + written)
        room = min(room, self.max_tokens - len(template) - (self.depth + 1 + self._tail_tokens))
        if room < 1:
            self.cut = True
            return None
        return ValueStep(template, room, stop)

    def _boundary(self, sample: str) -> int:
        """Where in :attr:`settled` the first token of ``settled + sample`` that covers the sample
        starts, as the tokenizer splits it (before a space it joins to the value, say)."""
        text = self.settled[-48:]                       # the local context decides the split
        offset = len(self.settled) - len(text)
        ids = self.tokenizer.encode(text + sample)
        start = 0
        for n in range(1, len(ids) + 1):
            end = len(self.tokenizer.decode(ids[:n], skip_special_tokens=False))
            if end > len(text):
                return offset + min(start, len(text))
            start = end
        return len(self.settled)

    def _string(self) -> Generator[ValueStep, Written, str]:
        # The opening quote stays fixed: a model's tokenizer keeps quotes apart from the letters after
        # them, and the stop string is the next quote.
        self.settled += '"'
        raw = ""
        while True:
            used = len(self.tokenizer.encode(raw)) if raw else 0
            step = self._step(min(STRING_CHUNK, STRING_LIMIT - used), ['"'], written=raw)
            if step is None:
                break
            got = yield step
            raw += got.text
            if got.stop == '"' and _odd_backslashes(raw):
                raw += '"'                              # an escaped quote, not the closing one: go on
                continue
            if got.stop is not None or not got.out_of_room:
                break                                   # closed, or the model ended its answer
            if used + step.room >= STRING_LIMIT or step.room < STRING_CHUNK:
                self.cut = True                         # the value goes on past what there is room for
                break
        self.settled = self.settled[:-1]                # the quotes come back with json.dumps
        return _json_string(raw)

    def _bare(self, kind: str, prop: dict) -> Generator[ValueStep, Written, object]:
        step = self._step(NUMBER_ROOM, BARE_STOPS, SAMPLES[kind])
        raw = "" if step is None else (yield step).text.strip()
        if kind == "boolean":
            return raw.lower().startswith("t")
        m = _NUMBER.match(raw)
        number = float(m.group(1)) if m else 0.0
        if kind == "enum":
            return min(prop["enum"], key=lambda v: abs(float(v) - number))
        written_int = m is not None and not re.search(r"[.eE]", m.group(1))
        if kind == "integer" or (written_int and number.is_integer()):
            return int(m.group(1)) if written_int else int(number)
        return number

    def _array(self) -> Generator[ValueStep, Written, list]:
        step = self._step(ARRAY_ROOM, ["]"], SAMPLES["array"])
        raw = "" if step is None else (yield step).text.strip()
        try:
            items = json.loads((raw if raw.startswith("[") else "[" + raw) + "]")
        except ValueError:
            items = []
        return items if isinstance(items, list) else []


def _odd_backslashes(text: str) -> bool:
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def _json_string(raw: str) -> str:
    """A JSON string's content as text (escapes read); what does not read is taken as written."""
    try:
        return json.loads('"' + raw + '"')
    except ValueError:
        return raw.replace('\\"', '"')
