"""What the Vertex AI backend's Google clients cost to import, so they stay lazy: fresh interpreter
per run, median of 5, for aiplatform_v1, logging_v2, and a REST JobServiceClient built on top."""

from __future__ import annotations

import statistics
import subprocess
import sys

PROBES = {
    "import google.cloud.aiplatform_v1": "import google.cloud.aiplatform_v1",
    "import google.cloud.logging_v2": "import google.cloud.logging_v2",
    "both + JobServiceClient(transport='rest')": (
        "import google.cloud.logging_v2\n"
        "from google.auth.credentials import AnonymousCredentials\n"
        "from google.cloud import aiplatform_v1\n"
        "aiplatform_v1.JobServiceClient(transport='rest', credentials=AnonymousCredentials(),"
        " client_options={'api_endpoint': 'http://127.0.0.1:9'})"
    ),
}


def timed(code: str) -> float:
    wrapper = f"import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    out = subprocess.run(
        [sys.executable, "-c", wrapper], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(runs: int = 5) -> int:
    for label, code in PROBES.items():
        times = [timed(code) for _ in range(runs)]
        print(f"{label}: median {statistics.median(times):.3f} s, worst {max(times):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
