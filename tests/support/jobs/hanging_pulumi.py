"""A pulumi that prints nothing and never ends on its own: `hanging_pulumi.py PIDS [--deaf]`.
SIGINT, pulumi's cancel, ends it at once (`--deaf`: never), whatever its parent left ignored or
blocked, as the Go CLI takes it (signal.Notify un-ignores it): a shell cannot trap a signal
ignored on entry. It and a child in its process group write their pids to PIDS."""

import signal
import sys

deaf = "--deaf" in sys.argv
signal.signal(signal.SIGINT, signal.SIG_IGN if deaf else lambda *_: sys.exit(130))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # as Go's runtime does
signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an ignored SIGCHLD would reap `sleep` unseen

import os  # noqa: E402  (after the handler: a SIGINT at once must not be lost)
import subprocess  # noqa: E402
import time  # noqa: E402

child = subprocess.Popen(["sleep", "300"])
with open(sys.argv[1], "a") as pids:
    pids.write(f"{os.getpid()}\n{child.pid}\n")
while True:
    time.sleep(0.2)
