"""The seeded corpus and the tokenizer trained on it."""

import json

import pytest

from dlm_backend.errors import DLMError
from dlm_tiny import corpus
from dlm_tiny.checkpoint import build_tokenizer
from dlm_tiny.entities import Entities
from dlm_tiny.train import parse_weights


def test_corpus_is_deterministic_and_covers_every_family():
    a = [e.to_json() for e in corpus.generate(200, seed=3)]
    b = [e.to_json() for e in corpus.generate(200, seed=3)]
    assert a == b
    assert {e["family"] for e in a} == {f for f, w in corpus.FAMILIES.items() if w > 0}
    assert a != [e.to_json() for e in corpus.generate(200, seed=4)]


def test_train_and_eval_entities_are_disjoint():
    import random
    train_names = {Entities(random.Random(0), "train").name() for _ in range(3000)}
    eval_ent = Entities(random.Random(1), "eval")
    eval_names = {eval_ent.name() for _ in range(500)} | {eval_ent.city() for _ in range(500)}
    assert not train_names & eval_names


def _qa_shares(examples) -> tuple[float, float]:
    """(share of QA examples, share of those that are unanswerable)."""
    qa = [e for e in examples if e.family == "qa"]
    return len(qa) / len(examples), sum(e.target == corpus.NOT_IN_CONTEXT for e in qa) / len(qa)


def test_a_training_mix_over_samples_a_family_and_unanswerable_questions():
    base_qa, base_absent = _qa_shares(corpus.generate(2000, seed=4))
    mixed_qa, mixed_absent = _qa_shares(corpus.generate(2000, seed=4, weights={"qa": 0.5}, unanswerable=0.5))
    assert mixed_qa > base_qa + 0.15
    assert mixed_absent > 0.4 and base_absent < 0.25


@pytest.mark.parametrize("spec, needle", [("qa=lots", "cannot read"), ("qa", "cannot read"),
                                          ("qa=-1", "negative weight"), ("poems=0.2", "unknown families")])
def test_a_bad_family_mix_names_the_problem(spec, needle):
    with pytest.raises(DLMError, match=needle):
        parse_weights(spec)


def test_hard_qa_puts_a_same_attribute_distractor_in_the_context():
    plain = corpus.generate(300, seed=6, families=["qa"])
    hard = corpus.generate(300, seed=6, families=["qa"], qa_hard=1.0)
    def distracted(examples):
        return sum(e.expected["distractor"] for e in examples)
    assert 250 < distracted(hard) < 300 and distracted(plain) < 150
    # every hard context has a second person with the asked attribute; it is a distractor only when
    # that value differs from the answer (a shared "red" is answered by the attribute alone)
    for e in hard:
        if not e.expected["distractor"]:
            assert json.dumps(e.messages).count(e.target) >= 2
    assert [e.target for e in corpus.generate(50, seed=6)] == [e.target for e in corpus.generate(50, seed=6, qa_hard=0)]


def test_rag_templates_write_qa_as_the_frameworks_send_it():
    examples = corpus.generate(200, seed=6, families=["qa"], rag_templates=1.0)
    seen = set()
    for e in examples:
        text = "\n".join(m["content"] for m in e.messages)
        needle = {"LlamaIndex query engine": "\nQuery: ", "LlamaIndex chat engine": "assist the user",
                  "LangChain rlm/rag-prompt": "\nContext: ", "LangChain retrieval chain": "question-answering"}
        assert needle[e.expected["template"]] in text       # the label names the prompt it wrote
        seen.add(e.expected["template"])
        if e.target != corpus.NOT_IN_CONTEXT:
            assert e.target in text
        assert e.messages[-1]["role"] == "user"
    assert len(seen) == 4
    # retrieved documents carry metadata headers, and some prompts hold several documents
    assert sum("file: " in json.dumps(e.messages) for e in examples) > 20
    assert any(json.dumps(e.messages).count("source: ") >= 2 for e in examples)
    # 0 draws nothing extra: stages trained before the flag keep their exact corpus
    assert [e.to_json() for e in corpus.generate(80, seed=6)] == \
        [e.to_json() for e in corpus.generate(80, seed=6, rag_templates=0.0)]


def test_a_word_tokenizes_the_same_wherever_it_stands():
    examples = corpus.generate(200, seed=0)
    tok = build_tokenizer([json.dumps(e.messages) + " " + e.target for e in examples], 512)
    pieces = lambda text: tok.encode(text).tokens                                  # noqa: E731
    word = pieces("Krexrou")
    assert pieces(" Krexrou.") == ["Ġ", *word, "."]           # after a space: the space is its own token
    assert pieces('"Krexrou"') == ['"', *word, '"']           # after a quote: the same pieces
    assert pieces("21098") == list("21098")                   # digits one by one
    assert tok.decode(tok.encode('in Krexrou, "Oslo" 42').ids) == 'in Krexrou, "Oslo" 42'
