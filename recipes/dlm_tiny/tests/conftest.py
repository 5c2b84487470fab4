import os
import sys
from pathlib import Path

# test_pointer builds on test_circuits' model helpers
sys.path.insert(0, str(Path(__file__).parent))
# Entry-point plugins installed beside the recipe must not change what these tests see; the tests of
# the recipe's own entry point run `dlm` in a subprocess with DLM_LOAD_PLUGINS=dlm_tiny.
os.environ.setdefault("DLM_DISABLE_PLUGIN_AUTOLOAD", "1")


def assert_grounded(qa: list, most_refused: float) -> None:
    """Each QA example's answer is in its prompt or is the refusal, and refusals are some but at most
    ``most_refused`` of them (so refusing is never the cheap answer to learn)."""
    from dlm_tiny.open_qa import NOT_IN_CONTEXT

    refused = [e for e in qa if e.target == NOT_IN_CONTEXT]
    assert 0 < len(refused) < len(qa) * most_refused
    for e in qa:
        assert e.target == NOT_IN_CONTEXT or e.target in " ".join(m["content"] for m in e.messages)
