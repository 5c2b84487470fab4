import importlib.util
import json
import os
import random
import sys
from pathlib import Path

import pytest

# test_pointer builds on test_circuits' model helpers
sys.path.insert(0, str(Path(__file__).parent))
# Entry-point plugins installed beside the recipe must not change what these tests see; the tests of
# the recipe's own entry point run `dlm` in a subprocess with DLM_LOAD_PLUGINS=dlm_tiny.
os.environ.setdefault("DLM_DISABLE_PLUGIN_AUTOLOAD", "1")


# Run on its own (pytest in recipes/dlm_tiny), pytest roots at the recipe's pyproject.toml and never
# reads the repository's conftest.py, so its gpu tests failed instead of skipping without CUDA. The
# repository's hook is loaded from there rather than written twice, and used only when pytest did not.
_RECIPE = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("repository_conftest", _RECIPE.parents[1] / "conftest.py")
_repository = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_repository)


def pytest_collection_modifyitems(config, items):
    if config.rootpath == _RECIPE:
        _repository.pytest_collection_modifyitems(config, items)


@pytest.fixture
def bank(tmp_path):
    """A question bank over 20 short articles (articles 0 and 10 held out), as write_prose_questions.py
    writes one, without the teacher's rewrites."""
    from dlm_tiny.prose_qa import candidates, load_articles

    root = tmp_path / "news"
    for i in range(20):
        body = [f"Harbour Board {i} said the town of Orvel{i} had {100 + i} boats last year.",
                f"Sales at the Orvel{i} market fell {i + 2}% over Christmas, hit by warm weather.",
                f"The Orvel{i} lighthouse was opened in {1800 + i} by the harbour board."]
        (root / "a").mkdir(parents=True, exist_ok=True)
        (root / "a" / f"{i:03d}.txt").write_text(f"Orvel story {i}\n\n" + "\n\n".join(body) + "\n")
    picks = candidates(load_articles(root), random.Random(0), per_article=3)
    path = tmp_path / "bank.jsonl"
    path.write_text("".join(json.dumps({**p, "rewrite": None}) + "\n" for p in picks))
    path.with_suffix(".json").write_text(json.dumps({"articles": str(root)}))
    return path
