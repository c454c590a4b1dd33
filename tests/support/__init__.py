"""What the tests share: fakes that speak the real protocols, the sshd test bed, shared tables and
helpers. Nothing here is a test module; test modules import from here, never from each other."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
JOBS = Path(__file__).resolve().parent / "jobs"  # small training jobs the tests launch


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (one holds nothing but its pid)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
