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


def _watch_world() -> None:
    """Whether this rank joins a process group: a multi-node job whose ranks never do trains
    independent copies (e.g. Lightning's Trainer(num_nodes=1) under torchrun). Once
    torch.distributed is imported its init_process_group is wrapped; $GPUTRAIN_WATCH_DIR/world/
    <RANK> gets the group's size when one is made, 0 if the process ends without one."""
    import atexit
    import importlib.machinery
    from collections.abc import Sequence
    from types import ModuleType

    watch = os.environ.get("GPUTRAIN_WATCH_DIR")
    if not watch or "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return
    path = os.path.join(watch, "world", os.environ["RANK"])
    joined: list[int] = []

    def record(size: int) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(str(size))

    def wrap(module: object) -> None:
        original = module.init_process_group  # type: ignore[attr-defined]

        def init_process_group(*args: object, **kwargs: object) -> object:
            result = original(*args, **kwargs)
            with contextlib.suppress(Exception):
                joined.append(module.get_world_size())  # type: ignore[attr-defined]
                record(joined[-1])
            return result

        for target in (module, getattr(module, "distributed_c10d", None)):
            if getattr(target, "init_process_group", None) is original:
                target.init_process_group = init_process_group  # type: ignore[union-attr]

    class AfterImport:
        """Finds torch.distributed as the path finder does, and wraps it once loaded."""

        def find_spec(
            self, name: str, search: Sequence[str] | None, target: ModuleType | None = None
        ) -> importlib.machinery.ModuleSpec | None:
            if name != "torch.distributed":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, search)
            loader = getattr(spec, "loader", None)
            if loader is not None and hasattr(loader, "exec_module"):
                run = loader.exec_module

                def exec_module(module: object) -> None:
                    run(module)
                    with contextlib.suppress(Exception):
                        wrap(module)

                loader.exec_module = exec_module
            return spec

    def at_exit() -> None:
        if not joined:
            record(0)

    sys.meta_path.insert(0, AfterImport())
    atexit.register(at_exit)


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
    _watch_world()
with contextlib.suppress(Exception):
    _chain()
