"""A stand-in for the node's python: records its argv (one per line) and env, for tests of the
command lines the node scripts build."""

FAKE_PY = """#!/bin/sh
# stands in for python: records argv (one per line, NUL-safe enough for the test) and env
[ "$2" = gputrain_node.telemetry ] && exit 0  # the GPU sampler beside torchrun (scripts/watch)
for a in "$@"; do printf '%s\\n' "$a"; done > "$OUT_ARGS"
env > "$OUT_ENV"
"""
