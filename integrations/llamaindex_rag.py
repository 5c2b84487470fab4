"""RAG with LlamaIndex on the embedded diffusion model: BM25 retrieval, a query engine and a chat engine."""

from llama_index.core import Document, Settings
from llama_index.core.chat_engine import ContextChatEngine
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.node_parser import SentenceSplitter
from llama_index.retrievers.bm25 import BM25Retriever

from dlm_backend.adapters.llamaindex import DLM

DOCUMENTS = [
    Document(text="Velmora works as a pharmacist. Velmora lives in Tarnhollow.", metadata={"file": "staff.txt"}),
    Document(text="Quentor plays fencing. Quentor has a pet owl.", metadata={"file": "clubs.txt"}),
    Document(text="Ysolde works at Brimwick Labs. Ysolde is 41 years old.", metadata={"file": "hr.txt"}),
    Document(text="The annual rowing race is held in Farrowmere.", metadata={"file": "events.txt"}),
]
QUESTIONS = {
    "Where does Velmora live?": "Tarnhollow",
    "What pet does Quentor have?": "owl",
    "Which company employs Ysolde?": "Brimwick Labs",
}


def build_query_engine():
    Settings.llm = llm = DLM(max_tokens=32)
    Settings.tokenizer = llm.tokenizer          # count chunks and prompts in the model's own tokens
    nodes = SentenceSplitter(chunk_size=128, chunk_overlap=0).get_nodes_from_documents(DOCUMENTS)
    retriever = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=1)
    return RetrieverQueryEngine.from_args(retriever)


def main() -> dict[str, str]:
    engine = build_query_engine()
    answers = {}
    for question in QUESTIONS:
        answers[question] = str(engine.query(question)).strip()
        print(f"Q: {question}\nA: {answers[question]}\n")
    chat_engine = ContextChatEngine.from_defaults(retriever=engine.retriever)
    answers["chat: Where does Velmora live?"] = str(chat_engine.chat("Where does Velmora live?")).strip()
    print("chat engine:", answers["chat: Where does Velmora live?"])
    return answers


if __name__ == "__main__":
    main()
