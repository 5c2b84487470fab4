"""A tensor-parallel worker started by ``workers.start``: ``python -m dlm_backend.engine.forward
CONFIG_JSON RANK WORLD STORE_ADDRESS``."""

import sys

from dlm_backend.engine.forward.workers import worker_main
from dlm_backend.errors import DLMError

spec, rank, world, address = sys.argv[1:5]
try:
    worker_main(spec, int(rank), int(world), address)
except (DLMError, RuntimeError) as exc:      # reported by rank 0 too (agree, the store), or rank 0 is gone
    print(f"dlm tensor-parallel worker {rank}: {exc}", file=sys.stderr)
    sys.exit(1)
