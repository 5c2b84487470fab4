"""Running a forward: the runner (runner.py), one forward's inputs as host values (batch.py),
fixed-shape steps replayed as CUDA graphs (cuda_graphs.py), and the tensor-parallel worker processes
that run rank 0's forwards on their shards (workers.py, started as ``python -m
dlm_backend.engine.forward``)."""
