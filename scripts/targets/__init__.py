"""Where a job runs: one module per target behind the `Target` protocol (targets/base.py)."""
