import importlib.util
import os
import sys
from pathlib import Path

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
