"""Grounded QA as the RAG frameworks actually send it: their default prompts around retrieved documents.

The corpus's own QA wrappers (``corpus.QA_WRAPPERS``) put one plain passage in the prompt. A retrieval
pipeline sends more: LlamaIndex's query engine adds a system prompt forbidding phrases like "the
context ..." and writes each node's metadata (``file: staff.txt``) above its text; its chat engine puts
the documents in the system message; LangChain's RAG prompts ask to "say that you don't know". A
stage trained with 35% refusals (y4) answered LlamaIndex's prompt for "Where does
Velmora live?" with "The context does not say." although the context said Tarnhollow, and the plain
wrappers never showed it that shape. ``dlm train --rag-templates`` mixes these in.

The wording below reproduces each framework's default prompt (LlamaIndex 0.12 ``DEFAULT_TEXT_QA_PROMPT``
and ``ContextChatEngine``'s default context template, LangChain hub ``rlm/rag-prompt`` and the
retrieval-chain example of its docs), because that exact text is what the model will see.
"""

from __future__ import annotations

import random

LLAMAINDEX_QA_SYSTEM = (
    "You are an expert Q&A system that is trusted around the world.\n"
    "Always answer the query using the provided context information, and not prior knowledge.\n"
    "Some rules to follow:\n"
    "1. Never directly reference the given context in your answer.\n"
    "2. Avoid statements like 'Based on the context, ...' or 'The context information ...' or anything "
    "along those lines.")
LANGCHAIN_RAG = ("You are an assistant for question-answering tasks. Use the following pieces of retrieved "
                 "context to answer the question. If you don't know the answer, just say that you don't know. "
                 "Use three sentences maximum and keep the answer concise.")


def _llamaindex_query(context: str, question: str) -> list[dict]:
    return [{"role": "system", "content": LLAMAINDEX_QA_SYSTEM},
            {"role": "user", "content": (
                "Context information is below.\n---------------------\n" + context + "\n---------------------\n"
                "Given the context information and not prior knowledge, answer the query.\n"
                f"Query: {question}\nAnswer: ")}]


def _llamaindex_chat(context: str, question: str) -> list[dict]:
    return [{"role": "system", "content": ("Use the context information below to assist the user.\n"
                                           f"--------------------\n{context}\n--------------------\n")},
            {"role": "user", "content": question}]


def _langchain_hub(context: str, question: str) -> list[dict]:
    return [{"role": "user", "content": f"{LANGCHAIN_RAG}\nQuestion: {question} \nContext: {context} \nAnswer:"}]


def _langchain_chain(context: str, question: str) -> list[dict]:
    return [{"role": "system", "content": f"{LANGCHAIN_RAG}\n\n{context}"}, {"role": "user", "content": question}]


TEMPLATES = {"LlamaIndex query engine": _llamaindex_query, "LlamaIndex chat engine": _llamaindex_chat,
             "LangChain rlm/rag-prompt": _langchain_hub, "LangChain retrieval chain": _langchain_chain}
STEMS = ["staff", "notes", "people", "hr", "clubs", "team", "records", "profiles", "directory", "members"]
# LlamaIndex writes "key: value" lines for each node's metadata above the text (MetadataMode.LLM);
# LangChain's stuff chain writes the page content only.
METADATA = [lambda r: "", lambda r: f"file: {r.choice(STEMS)}.txt\n\n",
            lambda r: f"file_name: {r.choice(STEMS)}.md\n\n",
            lambda r: f"page_label: {r.randint(1, 40)}\nfile_path: docs/{r.choice(STEMS)}.pdf\n\n",
            lambda r: f"source: {r.choice(STEMS)}.txt\n\n"]


def framework_rag(rng: random.Random, facts: list[str], question: str) -> tuple[str, list[dict]]:
    """``facts`` split into 1-3 retrieved documents, each with a metadata header, in a framework's prompt.

    Returns the template's name (a key of :data:`TEMPLATES`) and the messages."""
    name = rng.choice(list(TEMPLATES))     # in insertion order: the order y6r (shipped) was trained with
    cuts = sorted(rng.sample(range(1, len(facts)), min(len(facts) - 1, rng.randint(0, 2))))
    header = rng.choice(METADATA)
    docs = [" ".join(facts[a:b]) for a, b in zip([0, *cuts], [*cuts, len(facts)])]
    # both frameworks join retrieved documents with a blank line
    return name, TEMPLATES[name]("\n\n".join(header(rng) + doc for doc in docs), question)
