"""Setup seconds on a node, first vs cached: the environment step of a run (venv, requirements
from a local package index, a `setup` command) built once, then skipped on the next run with the
same content hash. Target: cached <= 10 % of first.

The node is this machine through the local transport (the same node script as over SSH); the
requirements are --packages tiny wheels built here and served over HTTP on loopback, and setup
sleeps --setup-s seconds (a stand-in for a data download or a build). Real projects install far
more (torch-sized wheels, minutes), so the first figure is a floor and the ratio a ceiling.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' package index

from scripts.job.environment import plan_environment
from scripts.job.environment_node import prepare_environment
from scripts.transport.local import LocalTransport
from tests.support.wheelhouse import PackageIndex, build_wheel

CODE = ".gputrain/code"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--packages", type=int, default=5, help="wheels in requirements.txt")
    p.add_argument("--setup-s", type=float, default=2.0, help="what setup sleeps")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with PackageIndex(root / "index") as index:
            names = [f"gputrain-bench-{i}" for i in range(args.packages)]
            for name in names:
                index.add(build_wheel(name, root / "wheels"))
            node = LocalTransport("node", root / "node")
            code = node.node_root / CODE
            code.mkdir(parents=True)
            (code / "requirements.txt").write_text("".join(f"{n}==1.0\n" for n in names))
            setup = f"sleep {args.setup_s}\npython -c 'import gputrain_bench_0'"
            env = plan_environment(code, setup=setup)
            assert env is not None
            env = env.for_python(sys.executable)
            times = []
            for run in ("first", "cached"):
                start = time.monotonic()
                out = prepare_environment(
                    ["node"],
                    {"node": node},
                    env,
                    python=sys.executable,
                    code_dir=CODE,
                    run_dir=f".gputrain/runs/{run}",
                    extra_env={"PIP_INDEX_URL": index.url, "PIP_CONFIG_FILE": "/dev/null"},
                    on_line=lambda n, line: None,
                )["node"]
                times.append(time.monotonic() - start)
                assert out.cached == (run == "cached")
    first, cached = times
    ratio = cached / first
    print(
        f"setup first:  {first:6.2f} s  (venv + {args.packages} wheels + setup {args.setup_s:g} s)"
    )
    print(f"setup cached: {cached:6.2f} s  ({ratio:.1%} of first; target <= 10 %)")
    return 0 if ratio <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
