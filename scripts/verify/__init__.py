"""Proving the machines before a job runs on them: the GPUs (gpus.py) and, for multi-node
GPUDirect stacks, the GPU network (fabric.py, with its pure rules in fabric_setup.py and
fabric_check.py)."""
