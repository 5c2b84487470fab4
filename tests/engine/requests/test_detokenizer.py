"""A request's text as it is committed (engine/requests/detokenizer.py): incremental decoding, stop strings
that complete across passes, tails held back until they cannot begin a stop string or a character."""

import pytest

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.requests.detokenizer import Detokenizer, hold_back


class Bytes:
    """A byte-level tokenizer: token i is byte i (a multi-byte character spans tokens)."""

    @staticmethod
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")


class Request:
    """What the detokenizer reads of a sequence and the finish it calls."""

    def __init__(self, prompt_len=3):
        self.prompt_len, self.committed_token_ids, self.num_emitted = prompt_len, [], 0
        self.is_finished, self.finish_reason, self.stop_reason, self.output_end = False, None, None, None

    def finish(self, reason, stop_reason=None, output_end=None):
        self.is_finished, self.finish_reason, self.stop_reason, self.output_end = True, reason, stop_reason, output_end

    def commit(self, detok, text: str) -> str:
        """Commit ``text``'s bytes in one pass; the text that streams."""
        self.committed_token_ids = self.committed_token_ids + list(text.encode())
        delta = detok.update(self)
        self.num_emitted = len(self.committed_token_ids)
        return delta


def test_a_stop_string_completed_across_passes_is_held_back_then_cut():
    seq, detok = Request(), Detokenizer(Bytes, ["END"], template_len=0)
    assert seq.commit(detok, "the E") == "the "              # "E" may begin the stop string: held back
    assert seq.commit(detok, "N") == "" and not seq.is_finished
    assert seq.commit(detok, "D and more") == "" and seq.is_finished
    assert (seq.finish_reason, seq.stop_reason) == ("stop", "END") and detok.text == "the "
    # the output ends at the token that completed the stop string, not at the end of its pass
    assert seq.output_end == seq.prompt_len + len("the END")


def test_a_held_back_tail_that_does_not_become_a_stop_string_is_streamed():
    seq, detok = Request(), Detokenizer(Bytes, ["END"], template_len=0)
    assert seq.commit(detok, "EN") == ""
    assert seq.commit(detok, "TER") == "ENTER" and not seq.is_finished


def test_a_character_split_over_passes_streams_once_whole():
    seq, detok = Request(), Detokenizer(Bytes, [], template_len=0)
    euro = "€".encode()                                        # three bytes, three tokens
    seq.committed_token_ids = [*b"1 ", euro[0]]
    assert detok.update(seq) == "1 "
    seq.committed_token_ids += [euro[1], euro[2]]
    assert detok.update(seq) == "€" and detok.text == "1 €"


REPLY = "café naïve 東京 😀 done"                         # 2-, 3- and 4-byte characters, no U+FFFD


@pytest.mark.parametrize("per_pass", [1, 2, 3, 5])
def test_a_replacement_character_stop_is_not_matched_inside_a_half_decoded_character(per_pass):
    """A stop of "\ufffd" ended this reply at its first multi-byte character cut between passes
    (the issue saw "café naïve "): the cut character decodes to U+FFFD until its last byte arrives."""
    seq, detok = Request(), Detokenizer(Bytes, ["\ufffd"], template_len=0)
    data, streamed = REPLY.encode(), ""
    for i in range(0, len(data), per_pass):
        seq.committed_token_ids = seq.committed_token_ids + list(data[i:i + per_pass])
        streamed += detok.update(seq)
        seq.num_emitted = len(seq.committed_token_ids)
        assert not seq.is_finished, (per_pass, streamed)
    seq.finish("length")
    streamed += detok.update(seq)
    assert streamed == detok.text == REPLY and seq.finish_reason == "length"


@pytest.mark.parametrize("final", [False, True])
def test_a_real_replacement_character_still_matches_a_stop(final):
    """Bytes that are no character at all (0xff) do decode to U+FFFD: a stop of it ends the reply
    there, once the next token (or the end of the request) shows the character is not still coming."""
    seq, detok = Request(), Detokenizer(Bytes, ["\ufffd"], template_len=0)
    seq.committed_token_ids = [*b"ok ", 0xFF]
    assert detok.update(seq) == "ok " and not seq.is_finished
    seq.num_emitted = 4
    if final:
        seq.finish("length")
    else:
        seq.committed_token_ids = seq.committed_token_ids + list(b" more")
    detok.update(seq)
    assert (seq.finish_reason, detok.text, seq.output_end) == ("stop", "ok ", seq.prompt_len + 4)


def test_a_stop_ending_in_a_multibyte_character_cuts_after_its_last_byte():
    seq, detok = Request(), Detokenizer(Bytes, ["é"], template_len=0)
    assert seq.commit(detok, "caf") == "caf"
    assert seq.commit(detok, "é and more") == "" and seq.is_finished
    assert detok.text == "caf" and seq.output_end == seq.prompt_len + len("café".encode())


def test_a_real_tokenizer_cuts_no_character_for_a_replacement_stop(dream_chat):
    """The same through the checkpoint's byte-level BPE, token by token (streamed) and all at once."""
    llm_tok = LLM(str(dream_chat)).tokenizer
    ids = llm_tok.encode(REPLY)
    assert any("\ufffd" in llm_tok.decode(ids[:n]) for n in range(len(ids)))     # characters span tokens
    for per_pass in (1, len(ids)):
        seq, detok = Request(), Detokenizer(llm_tok, ["\ufffd"], template_len=0)
        for i in range(0, len(ids), per_pass):
            seq.committed_token_ids = ids[:i + per_pass]
            detok.update(seq)
            seq.num_emitted = len(seq.committed_token_ids)
            assert not seq.is_finished, (per_pass, detok.text)
        seq.finish("length")
        detok.update(seq)
        assert detok.text == REPLY and seq.finish_reason == "length"


def test_stop_strings_count_only_past_the_response_template():
    seq, detok = Request(), Detokenizer(Bytes, ['"'], template_len=len('{"a": "'))
    assert seq.commit(detok, '{"a": "') == '{"a": "'           # the template's own quotes do not stop it
    assert not seq.is_finished
    assert seq.commit(detok, 'x", "b": 1}') == "x"
    assert seq.is_finished and detok.text == '{"a": "x' and seq.output_end == seq.prompt_len + len('{"a": "x"')


@pytest.mark.parametrize("text,stops,safe", [
    ("abc", [], "abc"),
    ("abc\ufffd", [], "abc"),                     # an unfinished UTF-8 character
    ("say STO", ["STOP"], "say "),
    ("say ST", ["STOP", "T"], "say "),            # the longest tail that may start any stop string
    ("say SOS", ["STOP"], "say SO"),
])
def test_hold_back(text, stops, safe):
    assert hold_back(text, stops) == safe


def test_chat_text_and_stop_strings(dream_chat):
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=24, block_length=8, ignore_eos=True)
    out = llm.chat([{"role": "user", "content": "Name three prime numbers."}], params)
    assert isinstance(out.text, str) and out.text == llm.tokenizer.decode(out.token_ids)
    assert len(out.text) > 3
    stop = out.text[2:4]
    cut = llm.chat([{"role": "user", "content": "Name three prime numbers."}], params.replace(stop=[stop]))
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == out.text[:out.text.index(stop)]
    # The output ends at the token that completes the stop string, not at the end of its pass:
    # threshold 0.01 commits the whole 8-slot block at once.
    fast = params.replace(sampler="threshold", threshold=0.01)
    messages = [{"role": "user", "content": "Name three prime numbers."}]
    full = llm.chat(messages, fast).token_ids
    decode = llm.tokenizer.decode
    i, stop = next((i, decode(full[i:i + 1])) for i in range(1, 7)       # a whole character, first seen at i
                   if decode(full[i:i + 1]).strip("\ufffd") and decode(full[i:i + 1]) not in decode(full[:i]))
    cut = llm.chat(messages, fast.replace(stop=[stop]))
    assert cut.token_ids == full[:i + 1] and cut.usage["completion_tokens"] == i + 1 < 8


def test_stream_yields_committed_text_in_order(dream_chat):
    llm = LLM(str(dream_chat))
    params = SamplingParams(sampler="llada", max_tokens=24, block_length=8, ignore_eos=True)
    messages = [{"role": "user", "content": "hello"}]
    chunks = list(llm.stream_chat(messages, params))
    assert chunks[-1].finished and chunks[-1].output is not None
    assert len(chunks) >= 3                       # at least one chunk per block
    assert "".join(c.delta_text for c in chunks) == chunks[-1].output.text
    assert sum((c.delta_token_ids for c in chunks), []) == chunks[-1].output.token_ids
    assert chunks[-1].output.text == llm.chat(messages, params).text
