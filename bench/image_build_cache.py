"""`build:` seconds, first vs cached: the stack target's image step (context hash, registry
lookup, build, targeted repository `up`, push) on a context of --mib MiB, then the same step on
an unchanged context (hash + one registry lookup, nothing built or pushed). Target: cached <= 10 %
of first.

The builder is podman behind the tests' `docker` shim and the registry Debian's docker-registry
on loopback (tests/support/containers.py), the stack the fake runner: a real GPU base image and
Artifact Registry over the internet make the first figure far larger, so the ratio is a ceiling.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' containers

from scripts.settings import Settings
from scripts.targets.base import RunOptions
from scripts.targets.gce.clients import GceClients
from scripts.targets.gce.target import GceTarget
from tests.support import ROOT
from tests.support.containers import Podman, Registry
from tests.support.fake_stack import FakeStackRunner
from tests.support.pulumi_mocks import TEST_PUBLIC_KEY


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mib", type=int, default=20, help="size of the context's data (MiB)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        root = Path(tmp)
        podman, registry = Podman(root / "podman"), Registry(root / "registry")
        try:
            podman.import_image("localhost/base:1", {"/usr/bin/hello": "#!/bin/sh\necho hi\n"})
            podman.trust(registry.host)
            podman("push", "-q", "localhost/base:1", f"docker://{registry.host}/base:1")
            proj = root / "proj"
            (proj / "img").mkdir(parents=True)
            (proj / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
            (proj / "Pulumi.bench.yaml").write_text(
                "config:\n  gcp:project: gputrain-bench\n  gputrain:machineType: g2-standard-8\n"
                f"  gputrain:sshPublicKey: {TEST_PUBLIC_KEY}\n"
                "  gputrain:sshSourceRanges: [203.0.113.7/32]\n  gputrain:build: img/Dockerfile\n"
            )
            (proj / "img" / "Dockerfile").write_text(
                f"FROM {registry.host}/base:1\nCOPY data.bin /data.bin\n"
            )
            (proj / "img" / "data.bin").write_bytes(os.urandom(args.mib << 20))
            os.environ["PATH"] = f"{podman.shim_dir}:{os.environ['PATH']}"
            os.environ["GPUTRAIN_REGISTRY_HOST"] = registry.host
            os.environ["GPUTRAIN_INSECURE_REGISTRIES"] = registry.host
            runner = FakeStackRunner(stack_name="bench", project="gputrain-bench")
            clients = GceClients(runner_for=lambda s, r: runner)
            settings = Settings(root=proj, runs_dir=root / "runs")
            times = []
            for _ in range(2):
                started = time.monotonic()
                GceTarget("bench", settings, clients).built_image(RunOptions())
                times.append(time.monotonic() - started)
            builds = podman.calls.read_text().split().count("build")
        finally:
            registry.stop()
            podman.cleanup()
    first, cached = times
    print(
        f"context {args.mib} MiB: first (build + push) {first:.2f} s, cached {cached:.2f} s "
        f"({cached / first:.1%} of first; target <= 10 %); docker builds: {builds}"
    )
    return 0 if cached <= 0.1 * first and builds == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
