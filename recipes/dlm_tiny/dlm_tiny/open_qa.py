"""Grounded QA over open-ended passages: many kinds of subject, relation, passage layout and prompt.

The first QA family (``corpus.qa``) states up to three facts about people in one sentence shape; the
model learned that shape. Here a passage is about lighthouses, bakeries, rivers, laptops, festivals,
novels or people, states 1-3 relations of each in one of several wordings, mixes in filler and
other subjects' facts of the same relation (so the answer must be bound to the subject asked
about), and is laid out as prose, lines, bullets, markdown, a fact sheet or numbered documents,
then wrapped in one of many prompt shapes, the question before or after it. The reply is the value
as the passage writes it, or :data:`corpus.NOT_IN_CONTEXT` when the passage does not say.
"""

from __future__ import annotations

import random

from dlm_tiny.entities import Entities
from dlm_tiny.open_words import COLOURS, FILLERS, MATERIALS, TOPICS, Values
from dlm_tiny.rag_templates import framework_rag

NOT_IN_CONTEXT = "The context does not say."
KNOWN_FOR = ["cheese", "apples", "wine", "glass", "boats", "wool", "tea", "honey", "pottery", "music", "bread"]
HOBBIES = ["painting", "hiking", "chess", "baking", "fishing", "knitting", "running", "gardening", "photography"]


def _unit(v: Values, lo: int, hi: int, units: list[str]) -> str:
    return f"{v.rng.randint(lo, hi)} {v.rng.choice(units)}"


# name: (kinds, value, statements, questions, fact-sheet labels); {s} the subject, {v} the value
RELATIONS = {
    "built": ("structure", lambda v: v.year(),
              ["{s} was built in {v}.", "Construction of {s} was finished in {v}.", "{s} dates from {v}."],
              ["When was {s} built?", "In what year was {s} built?", "What year was {s} completed?"], ["Built"]),
    "opened": ("structure org", lambda v: v.year(), ["{s} opened in {v}.", "{s} first opened its doors in {v}."],
               ["When did {s} open?", "What year did {s} open?"], ["Opened"]),
    "designed": ("structure", lambda v: v.person(),
                 ["{s} was designed by {v}.", "The architect of {s} was {v}.", "{v} designed {s}."],
                 ["Who designed {s}?", "Who was the architect of {s}?"], ["Architect", "Designed by"]),
    "located": ("structure org event", lambda v: v.place(),
                ["{s} is in {v}.", "{s} is located in {v}.", "You can find {s} in {v}.", "{s} stands in {v}."],
                ["Where is {s}?", "Where is {s} located?", "In which town is {s}?", "What city is {s} in?"],
                ["Location", "City"]),
    "height": ("structure place", lambda v: _unit(v, 5, 900, ["metres", "meters", "feet", "m"]),
               ["{s} is {v} tall.", "{s} rises {v} high.", "The height of {s} is {v}."],
               ["How tall is {s}?", "What is the height of {s}?", "How high is {s}?"], ["Height"]),
    "address": ("structure org", lambda v: v.street(), ["{s} is at {v}.", "The address of {s} is {v}."],
                ["What is the address of {s}?", "At what address is {s}?"], ["Address"]),
    "material": ("structure", lambda v: v.rng.choice(MATERIALS), ["{s} is made of {v}.", "{s} was built from {v}."],
                 ["What is {s} made of?", "What material was used for {s}?"], ["Material"]),
    "visitors": ("structure place event", lambda v: v.big(),
                 ["About {v} people visit {s} every year.", "{s} gets around {v} visitors a year."],
                 ["How many people visit {s} each year?", "How many visitors does {s} get a year?"],
                 ["Visitors per year"]),
    "capacity": ("structure", lambda v: v.count(10, 90000),
                 ["{s} can hold {v} people.", "{s} has room for {v} people.", "The capacity of {s} is {v}."],
                 ["How many people can {s} hold?", "What is the capacity of {s}?"], ["Capacity"]),
    "named": ("structure place org", lambda v: v.person(), ["{s} is named after {v}.", "{s} takes its name from {v}."],
              ["Who is {s} named after?", "Whom was {s} named after?"], ["Named after"]),
    "opens": ("structure org", lambda v: v.time(), ["{s} opens at {v}.", "Every day {s} opens at {v}."],
              ["What time does {s} open?", "When does {s} open in the morning?"], ["Opening time", "Opens"]),
    "closed": ("structure org", lambda v: v.weekday(), ["{s} is closed on {v}.", "On {v}, {s} stays closed."],
               ["On which day is {s} closed?", "What day is {s} closed?"], ["Closed on"]),
    "founded": ("org", lambda v: v.year(),
                ["{s} was founded in {v}.", "{s} was established in {v}.", "{s} started in {v}."],
                ["When was {s} founded?", "In what year was {s} established?", "What year did {s} start?"],
                ["Founded", "Established"]),
    "founder": ("org", lambda v: v.person(), ["{s} was founded by {v}.", "{v} founded {s}.", "{v} started {s}."],
                ["Who founded {s}?", "Who started {s}?", "Who is the founder of {s}?"], ["Founder"]),
    "leader": ("org", lambda v: v.person(),
               ["{s} is run by {v}.", "{v} leads {s}.", "The head of {s} is {v}.", "{v} is the CEO of {s}."],
               ["Who runs {s}?", "Who leads {s}?", "Who is in charge of {s}?"], ["Head", "CEO", "Manager"]),
    "based": ("org", lambda v: v.place(), ["{s} is based in {v}.", "{s} has its headquarters in {v}."],
              ["Where is {s} based?", "Where are the headquarters of {s}?"], ["Headquarters", "Based in"]),
    "staff": ("org", lambda v: v.count(3, 90000),
              ["{s} employs {v} people.", "{s} has {v} employees.", "About {v} people work at {s}."],
              ["How many people work at {s}?", "How many employees does {s} have?"], ["Employees", "Staff"]),
    "phone": ("org", lambda v: v.phone(), ["The phone number of {s} is {v}.", "You can call {s} on {v}."],
              ["What is the phone number of {s}?", "What number do I call to reach {s}?"], ["Phone"]),
    "email": ("org person", lambda v: v.email(), ["The email address of {s} is {v}.", "{s} can be reached at {v}."],
              ["What is the email address of {s}?", "How can I email {s}?"], ["Email"]),
    "population": ("place", lambda v: v.big(),
                   ["{s} has a population of {v}.", "About {v} people live in {s}.", "{s} is home to {v} people."],
                   ["What is the population of {s}?", "How many people live in {s}?"], ["Population"]),
    "region": ("place", lambda v: v.place(), ["{s} lies in the region of {v}.", "{s} is part of {v}."],
               ["Which region is {s} in?", "What region does {s} belong to?"], ["Region"]),
    "length": ("place structure", lambda v: _unit(v, 1, 3000, ["km", "kilometres", "miles", "metres"]),
               ["{s} is {v} long.", "{s} stretches for {v}."], ["How long is {s}?", "What is the length of {s}?"],
               ["Length"]),
    "known": ("place org", lambda v: v.rng.choice(KNOWN_FOR), ["{s} is known for its {v}.", "{s} is famous for its {v}."],
              ["What is {s} known for?", "What is {s} famous for?"], ["Known for"]),
    "price": ("product event", lambda v: v.price()[0],
              ["{s} costs {v}.", "{s} sells for {v}.", "The price of {s} is {v}."],
              ["How much does {s} cost?", "What is the price of {s}?", "How much is {s}?"], ["Price"]),
    "maker": ("product", lambda v: v.ent.company(), ["{s} is made by {v}.", "{v} makes {s}.", "{s} is produced by {v}."],
              ["Who makes {s}?", "Which company makes {s}?", "Who produces {s}?"], ["Manufacturer", "Brand"]),
    "weight": ("product", lambda v: v.rng.choice([_unit(v, 50, 990, ["grams", "g"]), _unit(v, 1, 40, ["kg", "kilograms"])]),
               ["{s} weighs {v}.", "The weight of {s} is {v}."], ["How much does {s} weigh?", "What is the weight of {s}?"],
               ["Weight"]),
    "battery": ("product", lambda v: _unit(v, 2, 72, ["hours"]),
                ["The battery of {s} lasts {v}.", "{s} runs for {v} on one charge."],
                ["How long does the battery of {s} last?", "What is the battery life of {s}?"], ["Battery life"]),
    "colour": ("product structure", lambda v: v.rng.choice(COLOURS), ["{s} is {v}.", "{s} comes in {v}.", "{s} is painted {v}."],
               ["What color is {s}?", "What colour is {s}?", "Which color does {s} come in?"], ["Color", "Colour"]),
    "released": ("product work", lambda v: str(v.rng.randint(1950, 2025)), ["{s} was released in {v}.", "{s} came out in {v}."],
                 ["When was {s} released?", "When did {s} come out?", "What year was {s} released?"], ["Released"]),
    "date": ("event", lambda v: v.date(), ["{s} takes place on {v}.", "{s} will be held on {v}.", "{s} is on {v}."],
             ["When is {s}?", "When does {s} take place?", "On what date is {s}?"], ["Date"]),
    "organiser": ("event", lambda v: v.rng.choice([v.person(), v.ent.company()]),
                  ["{s} is organised by {v}.", "{v} organizes {s}.", "{s} is run by {v}."],
                  ["Who organizes {s}?", "Who is the organiser of {s}?"], ["Organiser", "Organizer"]),
    "starts": ("event", lambda v: v.time(), ["{s} starts at {v}.", "{s} begins at {v}."],
               ["What time does {s} start?", "When does {s} begin?"], ["Start time", "Starts"]),
    "author": ("work", lambda v: v.person(),
               ["{s} was written by {v}.", "{v} wrote {s}.", "{s} was created by {v}.", "{v} is the author of {s}."],
               ["Who wrote {s}?", "Who is the author of {s}?", "Who created {s}?"], ["Author", "Creator"]),
    "about": ("work", lambda v: v.rng.choice(TOPICS), ["{s} is about {v}.", "{s} tells the story of {v}."],
              ["What is {s} about?", "What story does {s} tell?"], ["Subject", "About"]),
    "pages": ("work", lambda v: v.rng.choice([_unit(v, 40, 900, ["pages"]), _unit(v, 2, 180, ["minutes"])]),
              ["{s} is {v} long.", "{s} runs to {v}."], ["How long is {s}?", "How many pages or minutes is {s}?"],
              ["Length"]),
    "age": ("person", lambda v: v.count(18, 95), ["{s} is {v} years old.", "{s} is {v}.", "{s} is {v} years of age."],
            ["How old is {s}?", "What is {s}'s age?"], ["Age"]),
    "home": ("person", lambda v: v.place(), ["{s} lives in {v}.", "{s} moved to {v}.", "{s} is from {v}."],
             ["Where does {s} live?", "Which city does {s} live in?", "Where is {s} from?"], ["City", "Home"]),
    "employer": ("person", lambda v: v.ent.company(), ["{s} works at {v}.", "{s} is employed by {v}."],
                 ["Where does {s} work?", "Who employs {s}?"], ["Employer", "Company"]),
    "birthday": ("person", lambda v: v.date(), ["{s} was born on {v}.", "{s}'s birthday is {v}."],
                 ["When was {s} born?", "When is {s}'s birthday?"], ["Birthday", "Born"]),
    "hobby": ("person", lambda v: v.rng.choice(HOBBIES), ["{s} enjoys {v}.", "In their free time, {s} likes {v}."],
              ["What does {s} enjoy doing?", "What is {s}'s hobby?"], ["Hobby"]),
}
KIND_RELATIONS = {kind: [r for r, spec in RELATIONS.items() if kind in spec[0].split()]
                  for kind in ["structure", "org", "place", "product", "event", "work", "person"]}


def _sentence(template: str, s: str, v: str) -> str:
    text = template.format(s=s, v=v)
    return text[0].upper() + text[1:]


def _layout(rng: random.Random, sentences: list[str], sheets: list[tuple[str, list]] | None) -> str:
    style = rng.randrange(8)
    if sheets and style == 7:           # fact sheets: "Name: ...", one labelled line per relation
        return "\n\n".join("\n".join([f"Name: {s}"] + [f"{label}: {v}" for label, v in rows]) for s, rows in sheets)
    if style in (0, 1, 2):
        return " ".join(sentences)
    if style == 3:
        return "\n".join(sentences)
    if style == 4:
        mark = rng.choice(["- ", "* ", "• "])
        return "\n".join(mark + s for s in sentences)
    if style == 5:
        return "\n".join(f"{i}. {s}" for i, s in enumerate(sentences, 1))
    if style == 6:
        head = rng.choice(["# Notes", "## Background", "### Facts", "# Overview", "## Details"])
        return f"{head}\n\n" + " ".join(sentences)
    cut = rng.randint(1, max(1, len(sentences) - 1))
    docs = [" ".join(sentences[:cut]), " ".join(sentences[cut:])]
    label = rng.choice(["Document {i}:", "[{i}]", "Source {i}:", "Passage {i}:"])
    return "\n\n".join(label.format(i=i) + "\n" + d for i, d in enumerate(docs, 1) if d)


def noisy_question(rng: random.Random, q: str) -> str:
    """``q`` as people type it, 3 times in 10: lower case without the mark, a lead-in, or a doubled mark."""
    style = rng.randrange(10)
    if style == 0:
        return q[0].lower() + q[1:-1]                    # "when was the orvel lighthouse built"
    if style == 1:
        return rng.choice(["Quick question: ", "I'd like to know: ", "Tell me this: ", "Please answer: "]) + q
    if style == 2:
        return q[:-1] + rng.choice(["??", " ?", "? Thanks.", "? Answer briefly."])
    return q


WRAPPERS = [
    "Context: {p}\nQuestion: {q}", "Context:\n{p}\n\nQuestion: {q}\nAnswer:", "CONTEXT:\n{p}\n\nQUESTION: {q}",
    "Question: {q}\nContext: {p}", "Based on the text below, answer the question.\n\n{p}\n\nQuestion: {q}",
    "Based on the text below: {q}\n\n{p}", "{p}\n\nBased on the passage above, {ql}",
    "Read the passage and answer the question.\n\nPassage: {p}\n\nQuestion: {q}\nAnswer:",
    "<context>\n{p}\n</context>\n\n{q}", "Here is some information:\n{p}\n\nUsing only this information, {ql}",
    "{q}\n\n{p}", "{p}\n{q}", 'Text: """{p}"""\nQ: {q}\nA:', "### Context\n{p}\n\n### Question\n{q}",
    "Answer the question using the document.\n\nDocument:\n{p}\n\n{q}", "{p}\n\nQ: {q}",
]
SYSTEMS = ["You are a helpful assistant.", "Answer the user's question using only the provided documents.",
           "You answer questions about documents. Be concise.", "You are a question answering assistant.",
           "Use the context to answer. If the answer is not in the context, say so."]


def open_qa(rng: random.Random, ent: Entities, unanswerable: float = 0.15, hard: float = 0.5) -> "dict":
    """One open QA example: ``messages``, ``target`` and ``expected`` (see :func:`corpus.qa` for the latter)."""
    vals = Values(rng, ent)
    kind = rng.choice(sorted(KIND_RELATIONS))
    subjects = [vals.person() if kind == "person" else vals.subject(kind) for _ in range(rng.choice([1, 1, 2, 3]))]
    known, sentences, sheets = {}, [], []
    for s in subjects:
        rows = []
        for rel in rng.sample(KIND_RELATIONS[kind], min(len(KIND_RELATIONS[kind]), rng.randint(1, 4))):
            known[(s, rel)] = RELATIONS[rel][1](vals)
            rows.append((rng.choice(RELATIONS[rel][4]), known[(s, rel)]))
            sentences.append(_sentence(rng.choice(RELATIONS[rel][2]), s, known[(s, rel)]))
        sheets.append((s, rows))
    if rng.random() < unanswerable:
        s = rng.choice(subjects)
        missing = [r for r in KIND_RELATIONS[kind] if (s, r) not in known]
        rel = rng.choice(missing) if missing else rng.choice(KIND_RELATIONS[kind])
        if not missing:                     # everything about s is known: ask about a stranger
            s = vals.person() if kind == "person" else vals.subject(kind)
        answer = NOT_IN_CONTEXT
    else:
        s, rel = rng.choice(sorted(known))
        answer = known[(s, rel)]
        if len(subjects) == 1 and rng.random() < hard:     # someone else with the asked relation
            other = vals.person() if kind == "person" else vals.subject(kind)
            value = RELATIONS[rel][1](vals)
            sentences.insert(rng.randrange(len(sentences) + 1), _sentence(rng.choice(RELATIONS[rel][2]), other, value))
            sheets.append((other, [(RELATIONS[rel][4][0], value)]))
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        sentences.insert(rng.randrange(len(sentences) + 1), rng.choice(FILLERS))
    question = noisy_question(rng, rng.choice(RELATIONS[rel][3]).format(s=s))
    question = question[0].upper() + question[1:]
    passage = lambda: _layout(rng, sentences, sheets if not any(f in sentences for f in FILLERS) else None)
    messages = qa_messages(rng, sentences, passage, question)
    return {"messages": messages, "target": answer, "expected": {"answer": answer}}


def qa_messages(rng: random.Random, sentences: list[str], passage, question: str) -> list[dict]:
    """The prompt around a passage and a question: a RAG framework's own (15%), the passage as the
    system turn (15%), or one of :data:`WRAPPERS`; ``passage()`` lays the sentences out when needed."""
    style = rng.random()
    if style < 0.15:
        return framework_rag(rng, sentences, question)[1]
    text = passage()
    if style < 0.3:        # the passage in the system turn, the question as the user's
        return [{"role": "system", "content": f"{rng.choice(SYSTEMS)}\n\n{text}"}, {"role": "user", "content": question}]
    ql = question[0].lower() + question[1:]
    messages = [{"role": "user", "content": rng.choice(WRAPPERS).format(p=text, q=question, ql=ql)}]
    if rng.random() < 0.25:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEMS)})
    return messages
