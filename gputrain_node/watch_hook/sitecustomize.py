"""gputrain's stack-dump hook, loaded by every Python process of a run (run.sh puts this folder
first on PYTHONPATH): in a torchrun worker (RANK set) faulthandler dumps every thread's stack to
$GPUTRAIN_WATCH_DIR/stacks/pid<PID>.txt on SIGRTMIN+5, and a marker says the process has the hook.
Then the interpreter's own sitecustomize, if any, is loaded as it would have been."""

import contextlib
import os
import sys


def _register() -> None:
    import faulthandler
    import signal

    watch = os.environ.get("GPUTRAIN_WATCH_DIR")
    if not watch or "RANK" not in os.environ:
        return
    pid = os.getpid()
    os.makedirs(os.path.join(watch, "stacks"), exist_ok=True)
    os.makedirs(os.path.join(watch, "hooked"), exist_ok=True)
    out = open(os.path.join(watch, "stacks", f"pid{pid}.txt"), "a")  # noqa: SIM115 (kept open)
    faulthandler.register(signal.SIGRTMIN + 5, file=out, all_threads=True)
    sys.modules[__name__].__dict__["_dump_file"] = out  # keep it open
    with open(os.path.join(watch, "hooked", str(pid)), "w") as marker:
        marker.write(os.environ["RANK"])


def _chain() -> None:
    """Import the next sitecustomize on sys.path (the one this file shadows)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


with contextlib.suppress(Exception):  # never break the user's program for a diagnostic
    _register()
with contextlib.suppress(Exception):
    _chain()
