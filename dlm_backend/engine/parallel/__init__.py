"""Tensor and expert parallelism on torch.distributed: the group of one engine, its collectives and how
each dimension splits (group.py). The sharded layers live with the other layers (layers/parallel.py),
the worker processes beside the runner they run (forward/workers.py)."""
