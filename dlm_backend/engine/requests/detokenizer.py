"""One request's text as it is committed: incremental decoding, stop strings, held-back tails."""

from __future__ import annotations


class Detokenizer:
    """Owned by a Sequence when the checkpoint has a tokenizer; ``update`` turns the committed
    tokens into the text not yet streamed, ending the request where a stop string completes."""

    def __init__(self, tokenizer, stop: list[str], template_len: int):
        self.tokenizer = tokenizer
        self.stop = stop
        self.template_len = template_len   # output tokens fixed by a response template
        self.text = ""                     # text already streamed

    def update(self, seq) -> str:
        """The new text of ``seq``'s committed tokens; finishes ``seq`` at a completed stop string."""
        tokens = seq.committed_token_ids
        text = self.tokenizer.decode(tokens)
        # Stop strings, like stop tokens, count only past a response template: its fixed text (a forced
        # call's '<tool_call>\n{"name": ...', a JSON skeleton's quotes) was not generated, and a stop of
        # '"' or '\n' there emptied the answer it was meant to shape.
        n_template = self.template_len
        stops = self.stop if len(tokens) >= n_template else ()
        free_from = len(self.tokenizer.decode(tokens[:n_template])) if stops and n_template else 0
        for stop in stops:
            at = text.find(stop, max(free_from, len(self.text) - len(stop)))
            if at != -1:
                # One pass may commit a block past the stop string: the output (and the usage count)
                # ends at the token that completes it, as a one-token-a-step engine's would.
                n = next(n for n in range(seq.num_emitted, len(tokens) + 1)
                         if len(self.tokenizer.decode(tokens[:n])) >= at + len(stop))
                seq.finish("stop", stop_reason=stop, output_end=seq.prompt_len + n)
                text = text[:at]
        visible = text if seq.is_finished else hold_back(text, self.stop)
        delta = visible[len(self.text):]
        self.text += delta
        return delta


def hold_back(text: str, stops: list[str]) -> str:
    """Text safe to stream: drop an unfinished UTF-8 character and any tail that may start a stop string."""
    if text.endswith("\ufffd"):
        text = text.rstrip("\ufffd")
    cut = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                cut = max(cut, n)
                break
    return text[:len(text) - cut] if cut else text
