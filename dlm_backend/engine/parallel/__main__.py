"""A tensor-parallel worker started by ``workers.start``: ``python -m dlm_backend.engine.parallel
CONFIG_JSON RANK WORLD INIT_METHOD``."""

import json
import sys

from dlm_backend.engine.config import EngineConfig
from dlm_backend.engine.parallel.workers import worker_main
from dlm_backend.errors import DLMError

spec, rank, world, init = sys.argv[1:5]
try:
    worker_main(EngineConfig(**json.loads(spec)), int(rank), int(world), init)
except (DLMError, RuntimeError) as exc:      # reported by rank 0 too (agree), or rank 0 is gone: no traceback
    print(f"dlm tensor-parallel worker {rank}: {exc}", file=sys.stderr)
    sys.exit(1)
