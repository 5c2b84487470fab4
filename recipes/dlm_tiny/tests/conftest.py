import os
import sys
from pathlib import Path

# test_pointer builds on test_circuits' model helpers
sys.path.insert(0, str(Path(__file__).parent))
# Entry-point plugins installed beside the recipe must not change what these tests see; the tests of
# the recipe's own entry point run `dlm` in a subprocess with DLM_LOAD_PLUGINS=dlm_tiny.
os.environ.setdefault("DLM_DISABLE_PLUGIN_AUTOLOAD", "1")

