"""The stack's SSH key pair: made once by `gputrain keygen` (never inside the Pulumi program), the
private half kept as a Pulumi secret and, while the controller runs, in a 0600 file of a private
per-user directory that the next start cleans if the controller was killed."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.base.errors import GputrainError, UserError
from infra.stackfile import qualify
from scripts.targets.stack.clients import StackError, StackRunner

PUBLIC_KEY = qualify("sshPublicKey")
PRIVATE_KEY = qualify("sshPrivateKey")


def generate_ssh_keypair(comment: str) -> tuple[str, str]:
    """A new ed25519 key pair: (private key in OpenSSH PEM, public key as an authorized_keys line).

    Only the public line goes into the stack config unencrypted; the private PEM is stored as a
    Pulumi secret and in a 0600 file on the operator's machine.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if any(c.isspace() for c in comment):
        raise ValueError(f"SSH key comment must not contain whitespace: {comment!r}")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.OpenSSH,
        encryption_algorithm=serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(
            encoding=serialization.Encoding.OpenSSH, format=serialization.PublicFormat.OpenSSH
        )
        .decode()
    )
    return private_pem, f"{public} {comment}" if comment else public


def store_new_keypair(runner: StackRunner, stack: str) -> None:
    """Generate a pair and store it in the stack config: the public line plain, the private PEM
    as a secret. The secret first: when it cannot be stored (no passphrase set), no public key
    is left behind whose private half is lost."""
    private, public = generate_ssh_keypair(f"gputrain-{stack}")
    try:
        runner.set_config(PRIVATE_KEY, private, secret=True)
    except StackError as e:
        if "PULUMI_CONFIG_PASSPHRASE" in e.raw:
            raise UserError(
                f"{PRIVATE_KEY} for stack {stack}: the passphrase secrets provider needs "
                "PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE) set; set it and "
                "run keygen again (nothing was stored)"
            ) from e
        raise
    runner.set_config(PUBLIC_KEY, public)


def key_root() -> Path:
    """This user's private directory for key files: 0700, owned by us, never a symlink."""
    root = Path(tempfile.gettempdir()) / f"gputrain-keys-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise GputrainError(
            f"{root} is not a private directory of this user (owner, mode 0700); "
            "remove it and try again"
        )
    return root


def clean_stale_key_dirs(root: Path) -> list[Path]:
    """Remove the key directories whose controller is gone (killed, even by SIGKILL): each live
    one holds an flock on its `lock` file, which the kernel releases when the process dies."""
    removed = []
    for d in sorted(root.iterdir()):
        try:
            fd = os.open(d / LOCK, os.O_RDWR)
        except FileNotFoundError:
            stale = not _pid_alive(d.name.split("-", 1)[0])  # died before taking the lock
        except OSError:
            continue
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                stale = True
            except BlockingIOError:
                stale = False
            finally:
                os.close(fd)
        if stale:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


LOCK = "lock"


def _pid_alive(pid: str) -> bool:
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


@contextmanager
def private_key_file(runner: StackRunner, stack: str, root: Path | None = None) -> Iterator[Path]:
    """The stack's private key in a 0600 file of a 0700 directory under key_root(), removed
    afterwards; directories left by a controller that was killed are removed first."""
    pem = runner.get_config(PRIVATE_KEY)
    if not pem:
        raise UserError(
            f"{PRIVATE_KEY} is not set for stack {stack}; run `gputrain keygen --stack {stack}`"
        )
    root = root or key_root()
    clean_stale_key_dirs(root)
    d = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
    lock = os.open(d / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while we run: the next start sees we are alive
        path = d / "id_ed25519"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w") as f:
            f.write(pem if pem.endswith("\n") else pem + "\n")
        yield path
    finally:
        shutil.rmtree(d, ignore_errors=True)
        os.close(lock)
