"""One request's text as it is committed: incremental decoding, stop strings, held-back tails."""

from __future__ import annotations

REPLACEMENT = "\ufffd"      # what a decoder writes for bytes that are not (yet) a whole UTF-8 character


class Detokenizer:
    """Owned by a Sequence when the checkpoint has a tokenizer; ``update`` turns the committed
    tokens into the text not yet streamed, ending the request where a stop string completes.

    Stop strings are matched on whole characters only: while more tokens may come, the text of the
    committed tokens can end in a character cut between tokens, which decodes to U+FFFD until its
    last byte arrives ("😀" is 4 bytes, often 2 or more tokens). A stop of "\\ufffd" matched that and
    ended "café naïve 東京 😀 done" at "café naïve ", though the reply holds no U+FFFD.
    """

    def __init__(self, tokenizer, stop: list[str], template_len: int):
        self.tokenizer = tokenizer
        self.stop = stop
        self.template_len = template_len   # output tokens fixed by a response template
        self.text = ""                     # text already streamed

    def update(self, seq) -> str:
        """The new text of ``seq``'s committed tokens; finishes ``seq`` at a completed stop string."""
        tokens = seq.committed_token_ids
        final = seq.is_finished            # no token comes after these: a U+FFFD at the end is the model's
        text = self.tokenizer.decode(tokens)
        # Stop strings, like stop tokens, count only past a response template: its fixed text (a forced
        # call's '<tool_call>\n{"name": ...', a JSON skeleton's quotes) was not generated, and a stop of
        # '"' or '\n' there emptied the answer it was meant to shape.
        n_template = self.template_len
        stops = self.stop if len(tokens) >= n_template else ()
        free_from = len(self.tokenizer.decode(tokens[:n_template])) if stops and n_template else 0
        whole = whole_characters(text, final)
        for stop in stops:
            at = whole.find(stop, max(free_from, len(self.text) - len(stop)))
            if at != -1:
                # One pass may commit a block past the stop string: the output (and the usage count)
                # ends at the token that completes it, as a one-token-a-step engine's would.
                # (A token whose bytes end a character is found by the text it decodes to; a
                # tokenizer whose prefixes do not decode to prefixes of the text, by its length.)
                upto = whole[:at + len(stop)]
                n = next(n for n in range(seq.num_emitted, len(tokens) + 1)
                         if (head := self.tokenizer.decode(tokens[:n])).startswith(upto)
                         or len(whole_characters(head, final and n == len(tokens))) >= len(upto))
                seq.finish("stop", stop_reason=stop, output_end=seq.prompt_len + n)
                text = whole = whole[:at]
                final = True
        visible = text if final else hold_back(text, self.stop)
        delta = visible[len(self.text):]
        self.text += delta
        return delta


def whole_characters(text: str, final: bool) -> str:
    """``text`` without a character still being decoded: unless ``final`` (no more tokens come), a
    trailing U+FFFD may be the first bytes of one, so it is left out until the next token settles it."""
    return text if final else text.rstrip(REPLACEMENT)


def hold_back(text: str, stops: list[str]) -> str:
    """Text safe to stream: drop an unfinished UTF-8 character and any tail that may start a stop string."""
    text = whole_characters(text, final=False)
    cut = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                cut = max(cut, n)
                break
    return text[:len(text) - cut] if cut else text
