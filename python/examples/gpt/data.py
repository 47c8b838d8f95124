"""The two tasks' data, both deterministic: the same seed gives every backend the same batches in
the same order.

Text: the repository's own notes and sources (every *.md, *.cpp, *.cu, *.cuh, *.h under stages/,
common/ and docs/), as bytes (vocabulary 256). The files, sorted by path, go one in ten to the
validation set (the 10th, 20th, … file) and the rest to training; a training batch is
`batch` windows of context+1 bytes at offsets drawn from a seeded generator, the targets the
inputs shifted by one.

Documents (TextData(documents=True)): each file, with the NUL byte that ends it, is a document,
and a batch also gives each token's document, doc_ids [batch, context] (the file's index):
a window that crosses a file's end holds the end of one document and the start of the next,
packed into one row. With document masking a token attends only to the earlier tokens of its
own file. cu_seqlens_of(doc_ids) turns the ids into the boundaries of the documents of the
batch's rows laid end to end (the packed layout stage 13 takes).

Key–value recall: a sequence of N tokens that hides `pairs` key→value pairs at random places
in random filler, then asks for every key's value:

    f f k₁ v₁ f f f k₂ v₂ f … f k_P v_P f f │ k_π(1) v_π(1) k_π(2) v_π(2) … k_π(P) v_π(P)
    ←────────────── N − 2P tokens ─────────────→ ←──────────── 2P tokens: the queries ──────────→

The loss is taken only where the next token is a queried value (the target at each query key
is its value; everywhere else it is −1, no loss). Keys are distinct within a sequence, so the
answer is always defined, and a pair can sit anywhere in the first N − 2P tokens: answering
needs attention that finds a key thousands of positions back and copies the token after it
(an induction head). Guessing gives ln(values) = ln 64 ≈ 4.16 nats, a model that
recalls, close to 0.

Learning to recall has a long plateau at chance that grows with N (attention starts spread
evenly over all N positions, so the signal of the one right position is weak). So the run
begins with shorter sequences (`phases`, e.g. 64 then 512 tokens, as many tokens per batch),
where the mechanism forms in a few hundred steps, then trains at N; validation is always at N.
The recall model also embeds each position's previous token (model.GPTConfig.previous_token),
the first half of an induction head, so that one attention layer can find the pair.
"""
import pathlib

import numpy as np

TEXT_SUFFIXES = (".md", ".cpp", ".cu", ".cuh", ".h")
TEXT_FOLDERS = ("stages", "common", "docs")


def repository_root():
    return pathlib.Path(__file__).resolve().parents[3]


def text_files(root):
    files = [p for folder in TEXT_FOLDERS for p in (root / folder).rglob("*")
             if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


class TextData:
    """Byte tokens of the repository's text, split by file into training and validation."""

    def __init__(self, root=None, context=1024, batch=16, seed=0, documents=False):
        root = pathlib.Path(root) if root else repository_root()
        files = text_files(root)
        if len(files) < 10:
            raise RuntimeError(f"text task: only {len(files)} text files under {root} "
                               f"({', '.join(TEXT_FOLDERS)}); expected the repository's notes and sources")
        val = [f.read_bytes() for k, f in enumerate(files) if k % 10 == 9]
        train = [f.read_bytes() for k, f in enumerate(files) if k % 10 != 9]
        # One file after another, each ended by a NUL byte (a "document boundary" token).
        self.train = np.frombuffer(b"".join(t + b"\0" for t in train), dtype=np.uint8)
        self.val = np.frombuffer(b"".join(t + b"\0" for t in val), dtype=np.uint8)
        # Where each file (a document) starts in its stream.
        self.train_starts = np.cumsum([0] + [len(t) + 1 for t in train[:-1]])
        self.val_starts = np.cumsum([0] + [len(t) + 1 for t in val[:-1]])
        self.context, self.batch, self.seed, self.documents = context, batch, seed, documents
        self.files = len(files)
        if len(self.val) < context + 1:
            raise RuntimeError(f"text task: the validation text ({len(self.val)} bytes) is shorter "
                               f"than one window of context + 1 = {context + 1} bytes")

    def describe(self):
        return (f"text: {self.files} files, {len(self.train) / 1e6:.2f} MB training, "
                f"{len(self.val) / 1e6:.2f} MB validation, byte tokens"
                + (", each file a document (document masking)" if self.documents else ""))

    def _windows(self, stream, starts, offsets):
        """inputs, targets [batch, context] of the windows at `offsets`, and with documents
        the inputs' doc_ids [batch, context]."""
        idx = offsets[:, None] + np.arange(self.context + 1)[None, :]  # [batch, context+1]
        w = stream[idx].astype(np.int64)
        if not self.documents:
            return w[:, :-1], w[:, 1:]                                # inputs, targets
        doc_ids = np.searchsorted(starts, idx[:, :-1], side="right") - 1
        return w[:, :-1], w[:, 1:], doc_ids

    def train_windows(self, offsets):
        """The training windows at these offsets into the training text (a batch of them)."""
        return self._windows(self.train, self.train_starts, np.asarray(offsets, dtype=np.int64))

    def seq_at(self, step):
        return self.context

    def train_batch(self, step):
        """Batch `step` of every run: offsets from a generator seeded by (seed, step)."""
        rng = np.random.default_rng([self.seed, step])
        offsets = rng.integers(0, len(self.train) - self.context - 1, size=self.batch)
        return self.train_windows(offsets)

    def val_batches(self, count):
        """The first `count` batches of non-overlapping windows spread evenly over the validation text."""
        n = count * self.batch
        offsets = np.linspace(0, len(self.val) - self.context - 1, n).astype(np.int64)
        return [self._windows(self.val, self.val_starts, offsets[i * self.batch:(i + 1) * self.batch])
                for i in range(count)]


def cu_seqlens_of(doc_ids):
    """The documents of rows doc_ids [batch, T] laid end to end (row 0's tokens, then row 1's, …):
    (cu_seqlens int32 [documents + 1], the longest document). A document cut by a row's end
    ends there; the next row starts a new one."""
    batch, T = doc_ids.shape
    starts = np.ones((batch, T), dtype=bool)                  # where a document starts
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    cu = np.append(np.flatnonzero(starts.reshape(-1)), batch * T).astype(np.int32)
    return cu, int(np.diff(cu).max())


class RecallData:
    """Synthetic key–value recall sequences of length `seq` (see the module's docstring)."""

    # Token ranges of the vocabulary (256): filler, keys, values.
    FILLER = (0, 64)
    KEYS = (64, 192)
    VALUES = (192, 256)

    def __init__(self, seq=4096, pairs=16, batch=16, seed=0, phases=()):
        n_keys = self.KEYS[1] - self.KEYS[0]
        if pairs > n_keys:
            raise ValueError(f"recall task: pairs = {pairs} exceeds the {n_keys} distinct keys")
        for n in [seq] + [n for n, _ in phases]:
            if n < 4 * pairs or seq % n:
                raise ValueError(f"recall task: a sequence of {n} tokens must hold {pairs} pairs and "
                                 f"their queries (at least 4·pairs = {4 * pairs}) and divide seq = {seq}")
        self.seq, self.pairs, self.batch, self.seed = seq, pairs, batch, seed
        self.phases = tuple(phases)  # ((length, until_step), …): the shorter sequences first

    def describe(self):
        return (f"recall: {self.pairs} key-value pairs hidden in {self.seq - 2 * self.pairs} tokens, "
                f"then {self.pairs} queries; chance loss ln {self.VALUES[1] - self.VALUES[0]} = "
                f"{np.log(self.VALUES[1] - self.VALUES[0]):.2f}")

    def seq_at(self, step):
        for length, until in self.phases:
            if step < until:
                return length
        return self.seq

    def make(self, rng, batch, N):
        """inputs, targets [batch, N] (int64); targets −1 except at the query keys."""
        P = self.pairs
        rows = np.arange(batch)[:, None]
        tokens = rng.integers(*self.FILLER, size=(batch, N))
        keys = rng.random((batch, self.KEYS[1] - self.KEYS[0])).argsort(axis=1)[:, :P] + self.KEYS[0]
        values = rng.integers(*self.VALUES, size=(batch, P))
        # The pairs go into distinct 2-token slots of the first N − 2P tokens.
        slots = rng.random((batch, (N - 2 * P) // 2)).argsort(axis=1)[:, :P]
        tokens[rows, 2 * slots] = keys
        tokens[rows, 2 * slots + 1] = values
        # The queries: every pair once, in a random order, at the end.
        order = rng.random((batch, P)).argsort(axis=1)
        query_pos = N - 2 * P + 2 * np.arange(P)[None, :]   # [1, P]
        tokens[rows, query_pos] = keys[rows, order]
        tokens[rows, query_pos + 1] = values[rows, order]
        targets = np.full((batch, N), -1, dtype=np.int64)
        targets[rows, query_pos] = values[rows, order]       # at a query key: predict its value
        return tokens.astype(np.int64), targets

    def train_batch(self, step):
        """Batch `step`: batch·seq tokens, in sequences of seq_at(step) tokens."""
        N = self.seq_at(step)
        return self.make(np.random.default_rng([self.seed, step]), self.batch * self.seq // N, N)

    def val_batches(self, count):
        rng = np.random.default_rng([self.seed, 1 << 30])    # a stream no training step uses
        return [self.make(rng, self.batch, self.seq) for _ in range(count)]
