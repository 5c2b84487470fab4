"""Tensor and expert parallelism on torch.distributed: the group (group.py), the sharded layers the
model families are built from (layers.py) and the worker processes (workers.py)."""
