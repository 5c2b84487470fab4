import os
import sys
from pathlib import Path

import pytest

# test_pointer builds on test_circuits' model helpers
sys.path.insert(0, str(Path(__file__).parent))
# Entry-point plugins installed beside the recipe must not change what these tests see; the tests of
# the recipe's own entry point run `dlm` in a subprocess with DLM_LOAD_PLUGINS=dlm_tiny.
os.environ.setdefault("DLM_DISABLE_PLUGIN_AUTOLOAD", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped cleanly without one")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
