"""Training data with no downloads: a synthetic Markov chain, byte-level text, or a nanoGPT .bin file.

Each optimizer step's rows on a rank are a pure function of (seed, step, rank), so a resumed run sees
exactly the data an uninterrupted run would, without saving any data-loader state, and the split
into micro-batches (chosen by hand or by `--batch-size auto`) does not change the data.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.errors import InputError

TRAIN, EVAL = 0, 1  # independent random streams
LLMC_MAGIC, LLMC_HEADER_BYTES = 20240520, 256 * 4  # llm.c .bin: int32[256] header, then uint16


def batch_rng(seed: int, step: int, rank: int, stream: int = TRAIN) -> np.random.Generator:
    return np.random.default_rng([seed, stream, step, rank])


@dataclass(frozen=True)
class MarkovChain:
    """An order-1 chain where each token has k distinct, equally likely successors.

    Every row then has entropy ln k, so the entropy rate H = -sum_i pi_i sum_j P_ij ln P_ij equals
    ln k for any stationary distribution pi: the exact floor of the expected next-token loss.
    """

    successors: np.ndarray  # (vocab, k) int64

    @classmethod
    def from_seed(cls, vocab: int, k: int, seed: int) -> MarkovChain:
        if not 1 <= k <= vocab:
            raise InputError(f"--successors {k}: must be between 1 and the vocab size {vocab}")
        rng = np.random.default_rng([seed, 0xC4A1])
        return cls(np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(vocab)]))

    @property
    def vocab_size(self) -> int:
        return int(self.successors.shape[0])

    def entropy_rate(self) -> float:
        k = self.successors.shape[1]
        row = np.full(k, 1.0 / k)
        return float(-(row * np.log(row)).sum())  # the same for every row, so pi drops out

    def sample(self, rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
        out = np.empty((batch, length), dtype=np.int64)
        out[:, 0] = rng.integers(self.vocab_size, size=batch)
        choice = rng.integers(self.successors.shape[1], size=(batch, length - 1))
        for t in range(1, length):
            out[:, t] = self.successors[out[:, t - 1], choice[:, t - 1]]
        return out


@dataclass(frozen=True)
class TokenFile:
    """A uint16 token array on disk (memory-mapped); batches are random windows of it."""

    path: Path
    tokens: np.ndarray

    def sample(self, rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
        starts = rng.integers(0, len(self.tokens) - length + 1, size=batch)
        return np.stack([self.tokens[s : s + length] for s in starts]).astype(np.int64)


@dataclass(frozen=True)
class DataSource:
    name: str  # "synthetic" or the path
    source: MarkovChain | TokenFile
    vocab_size: int  # token ids are < this
    loss_floor: float | None  # known only for synthetic data

    def batch(
        self,
        seed: int,
        step: int,
        rank: int,
        rows: int,
        block: int,
        stream: int = TRAIN,
    ) -> np.ndarray:
        """(rows, block + 1) int64 tokens: inputs are [:, :-1], targets [:, 1:]."""
        return self.source.sample(batch_rng(seed, step, rank, stream), rows, block + 1)


def open_data(
    spec: str, *, block_size: int, vocab_size: int, successors: int, seed: int
) -> DataSource:
    """`synthetic`, a `.bin` token file, or a text file/directory (byte-level, cached once in
    data_cache_dir(): never beside the data, which may be read-only or shared)."""
    if spec == "synthetic":
        chain = MarkovChain.from_seed(vocab_size, successors, seed)
        return DataSource("synthetic", chain, vocab_size, chain.entropy_rate())
    path = Path(spec)
    if not path.exists():
        raise InputError(f"--data {spec}: no such file or directory (or use 'synthetic')")
    if path.is_file() and path.suffix == ".bin":
        tokens, vocab = read_bin(path), vocab_size
    else:
        tokens, vocab = np.memmap(byte_cache(path), dtype=np.uint16, mode="r"), 256
    if len(tokens) < block_size + 2:
        raise InputError(
            f"data file {path} is too short: {len(tokens)} tokens, "
            f"need at least {block_size + 2} for a block size of {block_size}"
        )
    top = int(tokens.max())  # one pass, so a bad id fails here and not on a GPU mid-run
    if top >= vocab:
        raise InputError(
            f"data file {path} holds token id {top}, not below the vocab size {vocab} "
            "(set --vocab-size)"
        )
    return DataSource(str(path), TokenFile(path, tokens), vocab, None)


def read_bin(path: Path) -> np.ndarray:
    """nanoGPT's raw uint16 tokens, or llm.c's format (a 1 KiB header with magic 20240520)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = np.frombuffer(f.read(min(size, LLMC_HEADER_BYTES)), dtype=np.uint8)
    if size >= LLMC_HEADER_BYTES and int(head[:4].view(np.int32)[0]) == LLMC_MAGIC:
        header = head.view(np.int32)
        count = int(header[2])
        if header[1] != 1 or size != LLMC_HEADER_BYTES + 2 * count:
            raise InputError(
                f"data file {path} is corrupt: llm.c header (version {header[1]}, "
                f"{count} tokens) does not match its size of {size} bytes"
            )
        return np.memmap(path, dtype=np.uint16, mode="r", offset=LLMC_HEADER_BYTES)
    if size % 2:
        raise InputError(
            f"data file {path} is corrupt: {size} bytes is not a whole number of uint16 tokens"
        )
    if size == 0:
        raise InputError(f"data file {path} is too short: it is empty")
    return np.memmap(path, dtype=np.uint16, mode="r")


DATA_CACHE_ENV = "GPUTRAIN_DATA_CACHE"


def data_cache_dir() -> Path:
    """$GPUTRAIN_DATA_CACHE, else $XDG_CACHE_HOME/gputrain-data, else ~/.cache/gputrain-data."""
    if os.environ.get(DATA_CACHE_ENV):
        return Path(os.environ[DATA_CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gputrain-data"


def byte_cache(path: Path) -> Path:
    """Tokenize a text file or directory once (UTF-8 bytes -> uint16) into
    `<cache dir>/<name>-<hash of its absolute path>.bytes.u16`."""
    files = (
        [path]
        if path.is_file()
        else sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(s.startswith(".") for s in p.parts)
        )
    )
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    cache = data_cache_dir() / f"{path.name}-{digest}.bytes.u16"
    newest = max((p.stat().st_mtime for p in files), default=0.0)
    if cache.exists() and cache.stat().st_mtime >= newest and cache.stat().st_size > 0:
        return cache
    data = b"".join(p.read_bytes() for p in files)
    if not data:
        raise InputError(f"data file {path} is too short: it holds no text")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"--data {path}: cannot create the byte cache in {cache.parent} ({e.strerror or e}); "
            f"set {DATA_CACHE_ENV} to a writable directory"
        ) from None
    tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")  # several ranks may race: each renames
    np.frombuffer(data, dtype=np.uint8).astype(np.uint16).tofile(tmp)
    os.replace(tmp, cache)
    return cache


def uniform_loss(vocab: int) -> float:
    """The loss of a model that knows nothing: ln V."""
    return math.log(vocab)
