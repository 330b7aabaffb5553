"""Token files: a corpus tokenised once into a memory-mapped array, read by windows.

On disk, `PREFIX.bin` holds every token id back to back (uint16 when the vocabulary fits,
else uint32), `PREFIX.idx` the int64 start offset of each document plus the end
(num_documents + 1 values), and `PREFIX.json` a small sidecar (dtype, counts, vocabulary size,
what it was built from). The sidecar is written last, so its presence marks a complete file;
every part goes through a temporary file and a rename.

    tokens = TokenFile.build("train", documents, tok.encode, tok.vocab_size, eos_id=tok.eos_token_id)
    window = tokens.window(1000, 257)          # np.ndarray (257,)
    docs = tokens.document_index(starts, 257)  # the document of each token of the windows at starts
    starts, lengths = tokens.chunks(257)       # rows that stay inside one document each

Building encodes on every core: the pieces are grouped into batches of about `BATCH_CHARS`
characters, forked worker processes encode the batches (a few in flight per worker, so a corpus
larger than memory streams through), and the parent writes their ids in the order read. Each
piece is encoded whole by the same `encode`, so the files are byte for byte those of one process.
"""

from __future__ import annotations

import functools
import itertools
import json
import multiprocessing
import os
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from attnlab.io.progress import Progress
from attnlab.io.files import atomic_file, atomic_write_text, json_text


BATCH_CHARS = 1 << 18  # characters of text per batch a worker encodes
IN_FLIGHT = 2  # batches handed to each worker ahead of the one written

Batch = list[tuple[str, bool]]  # (piece, ends_document) pairs


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 for vocabularies up to 65,536 ids, else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class TokenFile:
    """A tokenised corpus on disk, memory-mapped (never read whole into memory).

    Args:
        prefix: path without extension (`PREFIX.bin`, `.idx`, `.json`).

    Raises:
        FileNotFoundError: the sidecar is missing (an unfinished or absent file).
        ValueError: the parts disagree with the sidecar (a truncated file).
    """

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = Path(prefix)
        meta_path = self.prefix.with_suffix(".json")
        if not meta_path.exists():
            raise FileNotFoundError(f"token file {str(self.prefix)!r} is missing or unfinished (no {meta_path.name})")
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        dtype = np.dtype(self.meta["dtype"])
        n = int(self.meta["num_tokens"])
        bin_path = self.prefix.with_suffix(".bin")
        if bin_path.stat().st_size != n * dtype.itemsize:
            raise ValueError(f"{bin_path}: {bin_path.stat().st_size} bytes, expected {n * dtype.itemsize} "
                             f"({n} tokens of {dtype}); the file is truncated, delete it to rebuild")
        self.tokens = np.memmap(bin_path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        self.offsets = np.fromfile(self.prefix.with_suffix(".idx"), dtype=np.int64)
        if len(self.offsets) != int(self.meta["num_documents"]) + 1 or (n and self.offsets[-1] != n):
            raise ValueError(f"{self.prefix}.idx does not match {meta_path.name}; delete the files to rebuild")
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # `chunks` per length

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def document(self, i: int) -> np.ndarray:
        """Token ids of document `i` (its EOS included when one was appended)."""
        return np.asarray(self.tokens[self.offsets[i]: self.offsets[i + 1]])

    def window(self, start: int, length: int) -> np.ndarray:
        """`length` consecutive token ids from `start`."""
        if start < 0 or start + length > len(self):
            raise ValueError(f"window [{start}, {start + length}) is outside the {len(self)} tokens")
        return np.asarray(self.tokens[start: start + length])

    def windows(self, starts: torch.Tensor | np.ndarray, length: int) -> torch.Tensor:
        """The windows of `length` tokens at `starts` -> LongTensor (N, length)."""
        if len(starts) == 0:
            return torch.zeros(0, length, dtype=torch.long)
        return torch.from_numpy(np.stack([self.window(int(s), length) for s in starts]).astype(np.int64))

    def random_starts(self, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """`batch_size` uniform random starts of windows of `length` tokens -> LongTensor (B,).

        Raises:
            ValueError: the corpus is shorter than one window.
        """
        if len(self) < length + 1:
            raise ValueError(f"{self.prefix.name}: {len(self)} tokens cannot fill a window of {length}; "
                             "use a shorter seq_len or more data")
        return torch.randint(0, len(self) - length + 1, (batch_size,), generator=generator)

    def random_windows(self, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """`batch_size` windows of `length` tokens at uniform random starts -> LongTensor (B, length).

        Raises:
            ValueError: the corpus is shorter than one window.
        """
        return self.windows(self.random_starts(batch_size, length, generator), length)

    def sequential_starts(self, length: int, limit: int | None = None) -> torch.Tensor:
        """The starts of `sequential_windows` -> LongTensor (N,)."""
        step = length - 1
        count = max(0, (len(self) - 1) // step)  # an empty file has no window (not -1 of them)
        if limit is not None:
            count = min(count, limit)
        return torch.arange(count, dtype=torch.long) * step

    def sequential_windows(self, length: int, limit: int | None = None) -> torch.Tensor:
        """Non-overlapping windows from the start (the last `length - 1`... tokens that do not
        fill a window are dropped), at most `limit` of them -> LongTensor (N, length); windows
        overlap by one token so that inputs/labels of causal LM cover every token once."""
        return self.windows(self.sequential_starts(length, limit), length)

    def document_index(self, starts: torch.Tensor | np.ndarray, length: int) -> torch.Tensor:
        """The document each token of the windows of `length` tokens at `starts` belongs to
        (its index in the file) -> LongTensor (N, length).

        Example: documents [0, 3) and [3, 5), windows of 4 at 1 -> [[0, 0, 1, 1]].
        """
        positions = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)
        return torch.from_numpy(np.searchsorted(self.offsets, positions, side="right") - 1)

    def chunks(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of at most `length` tokens that each stay inside one document: every document cut
        from its start into pieces of `length` tokens that overlap by one (as `sequential_windows`
        do), so that their inputs and labels cover each of its tokens once; a document of one
        token has none. In file order.

        Example: documents of 3 and 6 tokens, length 4 -> starts [0, 3, 6], lengths [3, 4, 3].

        Returns:
            (starts, lengths): int64 arrays (N,).
        """
        if length < 2:
            raise ValueError(f"length must be >= 2 (an input and its label), got {length}")
        if length not in self._chunks:
            sizes = np.diff(self.offsets)
            counts = -(-np.maximum(sizes - 1, 0) // (length - 1))  # ceil((size - 1) / (length - 1)) each
            doc = np.repeat(np.arange(len(sizes)), counts)
            nth = np.arange(len(doc)) - np.repeat(np.cumsum(counts) - counts, counts)  # piece j of its document
            starts = self.offsets[:-1][doc] + nth * (length - 1)
            lengths = np.minimum(length, self.offsets[1:][doc] - starts)
            self._chunks[length] = (starts.astype(np.int64), lengths.astype(np.int64))
        return self._chunks[length]

    @classmethod
    def build(cls, prefix: str | os.PathLike, pieces: Iterable[tuple[str, bool]] | Iterable[str],
              encode: Callable[[str], list[int]], vocab_size: int, *, eos_id: int | None = None,
              total_chars: int | None = None, source: str = "", show_progress: bool = True,
              workers: int | None = None) -> "TokenFile":
        """Tokenise text into a token file.

        Args:
            prefix: output path without extension.
            pieces: documents (str), or `(piece, ends_document)` pairs for streamed documents.
            encode: text -> ids (e.g. `Tokenizer.encode`).
            vocab_size: the tokenizer's vocabulary size (picks uint16/uint32).
            eos_id: appended after every document (packing for causal LM), or None.
            total_chars: characters expected (for the progress ETA).
            source: recorded in the sidecar.
            show_progress: print a progress line (characters/s and ETA) on stderr.
            workers: processes that encode (None: one per available core; 1: in this process).
                Text of one batch or less, and platforms other than Linux (workers are forked),
                encode in this process.

        Returns:
            the opened TokenFile.

        Raises:
            ValueError: `encode` returned ids outside [0, vocab_size); `workers` below 1.
        """
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive int or None (every core), got {workers!r}")
        prefix = Path(prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        dtype = token_dtype(vocab_size)
        encode_batch = functools.partial(_encode_batch, encode=encode, eos_id=eos_id, dtype=dtype,
                                         vocab_size=vocab_size)
        offsets, count = [0], 0
        bar = Progress(total_chars, unit="char", desc=f"tokenise {prefix.name}", enabled=show_progress)
        # both files are renamed into place only when complete, the .bin first
        with atomic_file(prefix.with_suffix(".idx")) as tmp_idx, atomic_file(prefix.with_suffix(".bin")) as tmp_bin:
            with open(tmp_bin, "wb") as out:
                for batch, (data, lengths) in encoded_batches(_batches(pieces), encode_batch, workers):
                    out.write(data)
                    for (text, ends), length in zip(batch, lengths):
                        count += length
                        if ends:
                            offsets.append(count)
                    bar.update(sum(len(text) for text, _ in batch))
            if offsets[-1] != count:  # a stream that ended inside a document
                offsets.append(count)
            np.asarray(offsets, dtype=np.int64).tofile(tmp_idx)
        bar.close()
        meta = {"dtype": dtype.name, "num_tokens": count, "num_documents": len(offsets) - 1,
                "vocab_size": vocab_size, "eos_id": eos_id, "source": source}
        atomic_write_text(prefix.with_suffix(".json"), json_text(meta, indent=2) + "\n")
        return cls(prefix)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def _batches(pieces: Iterable[tuple[str, bool]] | Iterable[str]) -> Iterator[Batch]:
    """`(piece, ends_document)` pairs (a str is a whole document) in lists of about `BATCH_CHARS`
    characters; a piece is never cut."""
    batch: Batch = []
    size = 0
    for item in pieces:
        text, ends = (item, True) if isinstance(item, str) else item
        batch.append((text, ends))
        size += len(text)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encode_batch(batch: Batch, *, encode: Callable[[str], list[int]], eos_id: int | None, dtype: np.dtype,
                  vocab_size: int) -> tuple[bytes, list[int]]:
    """The ids of a batch's pieces back to back (EOS after each document's end) as `dtype`
    bytes, and the number of ids of each piece.

    Raises:
        ValueError: `encode` returned an id outside [0, vocab_size).
    """
    ids: list[int] = []
    lengths = []
    for text, ends in batch:
        piece = list(encode(text))
        if ends and eos_id is not None:
            piece.append(eos_id)
        if piece and (min(piece) < 0 or max(piece) >= vocab_size):
            raise ValueError(f"encode returned ids outside [0, {vocab_size})")
        ids.extend(piece)
        lengths.append(len(piece))
    return np.asarray(ids, dtype=dtype).tobytes(), lengths


def encoded_batches(batches: Iterable[Batch], encode_batch: Callable[[Batch], tuple[bytes, list[int]]],
                    workers: int | None) -> Iterator[tuple[Batch, tuple[bytes, list[int]]]]:
    """`(batch, encode_batch(batch))` for each batch, in order: in forked worker processes when
    there are several workers and more than one batch, else in this process.

    The first batch is encoded here, before the workers fork: they inherit `encode_batch` as
    it then is (never pickled), its tokenizer's cache of encoded words warm. Each worker gets
    `IN_FLIGHT` batches ahead of the one being written (memory stays bounded whatever the corpus
    size) and ignores Ctrl-C (the parent stops them). An error in a worker is raised here.
    """
    batches = iter(batches)
    head = list(itertools.islice(batches, 2))
    workers = available_cores() if workers is None else workers
    if workers == 1 or len(head) < 2 or not _can_fork():
        for batch in itertools.chain(head, batches):
            yield batch, encode_batch(batch)
        return
    yield head[0], encode_batch(head[0])
    with multiprocessing.get_context("fork").Pool(workers, _start_worker, (encode_batch,)) as pool:
        pending: deque = deque()
        for batch in itertools.chain(head[1:], batches):
            pending.append((batch, pool.apply_async(_run_worker, (batch,))))
            if len(pending) > IN_FLIGHT * workers:
                batch, result = pending.popleft()
                yield batch, result.get()
        while pending:
            batch, result = pending.popleft()
            yield batch, result.get()


def _can_fork() -> bool:
    """Workers are forked (they inherit the encoder as it is): on Linux only, where forking
    is the usual way (macOS's system libraries are not safe to fork)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


_WORKER_ENCODE: Callable[[Batch], tuple[bytes, list[int]]] | None = None  # set in each forked worker


def _start_worker(encode_batch: Callable[[Batch], tuple[bytes, list[int]]]) -> None:
    global _WORKER_ENCODE
    _WORKER_ENCODE = encode_batch
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_worker(batch: Batch) -> tuple[bytes, list[int]]:
    return _WORKER_ENCODE(batch)
