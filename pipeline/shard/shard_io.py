"""Streaming shard writes and the sorted spill files of the file-based shuffle.

A spill file holds one chunk of a read task's records sorted by shuffle
key, each exactly as the shard will hold it (the serialized Example in
TFRecord framing), then a footer: every record's key and length, and a
table of its buckets (first record, end offset, checksums). Because the
order is by key, every bucket -- and so every shard's share -- is one
contiguous range of the file. Once the plan is known, a shard index is
written beside each spill file (`shard_index`): the range of it that each
shard takes. Beam carries a few scalars per spill file (`SpillFile`); the
tables stay on disk, and each step reads the part it needs.

A shard is the merge of its ranges of all spill files (`merge_spill_ranges`):
the order comes from the index in one numpy sort, and the bytes are read in
blocks, so the merge's memory stays flat however large the shard. The
framed bytes are copied as they are (each record is framed, and its CRCs
computed, once); the bucket checksums are checked as the bytes are read, so
a damaged spill file fails the job instead of reaching a shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import zlib
from typing import Iterator, Sequence

import google_crc32c

import numpy as np

from mnist_contract import framing
from pipeline import stop, storage
from pipeline.shard.batches import in_key_order, key_order
from pipeline.shard.config import KEY_BYTES, SHARDS
from pipeline.shard.overlap import InOrder

_WRITE_BYTES = 1 << 20  # bytes a shard writer gathers before it writes


class ShardFileWriter:
    """Writes framed records to ``path``, counting and hashing the stored bytes."""

    def __init__(self, path: str, compression: str):
        self._file = storage.open_uncached(path)
        # wbits=31: a gzip stream with mtime 0, so output is byte-reproducible.
        self._gzip = zlib.compressobj(6, zlib.DEFLATED, 31) if compression == "gzip" else None
        self._sha256 = hashlib.sha256()
        self.num_examples = 0
        self.num_bytes = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._io = InOrder()  # compress, write and hash beside the caller's work

    def _store(self, data, last: bool = False) -> None:
        if self._gzip:
            data = self._gzip.compress(data) + (self._gzip.flush() if last else b"")
        if len(data):
            self._file.write(data)
            self._sha256.update(data)
            self.num_bytes += len(data)

    def _emit(self, data, last: bool = False) -> None:
        stop.raise_if_requested()  # an in-process worker of a stopped job writes no more
        self._io.submit(self._store, data, last)

    def write(self, example: bytes) -> None:
        self.write_block(framing.frame_record(example))

    def write_block(self, framed, count: int = 1) -> None:
        """Writes ``count`` records already in TFRecord framing, joined (bytes or
        a uint8 array, which must not change afterwards: it is written later)."""
        self.num_examples += count
        if not self._pending and len(framed) >= _WRITE_BYTES:
            self._emit(framed)
            return
        self._pending.append(framed)
        self._pending_bytes += len(framed)
        if self._pending_bytes >= _WRITE_BYTES:
            self._emit(b"".join(self._pending))
            self._pending, self._pending_bytes = [], 0

    def write_all(self, examples) -> None:
        for example in examples:
            self.write(example)

    def close(self) -> dict:
        self._emit(b"".join(self._pending), last=True)
        self._pending = []
        self._io.wait_all()
        self._file.close()
        return {"num_examples": self.num_examples, "num_bytes": self.num_bytes,
                "sha256": self._sha256.hexdigest()}


# A spill file's bucket table, one row per bucket in ascending order: its id,
# its first record, the file offset after its records, the crc32c of its
# records' bytes and the crc32c of its keys and lengths in the footer.
BUCKET_ROW = np.dtype([("bucket", "<u4"), ("first", "<u4"), ("end", "<u8"),
                       ("crc", "<u4"), ("index_crc", "<u4")])

# A spill file's shard index, written beside it (``<spill>.shards``) once the
# plan is known: row ``s`` is the range shard ``s`` takes, as `SpillRange`
# holds it (rows ``[lo, hi)`` of the bucket table, empty if equal), then the
# crc32c of the row's other fields.
SHARD_ROW = np.dtype([("lo", "<u4"), ("hi", "<u4"), ("start", "<u8"), ("first", "<u4"),
                      ("stop", "<u4"), ("rows_crc", "<u4"), ("crc", "<u4")])
_SHARD_ROW_CHECKED = SHARD_ROW.fields["crc"][1]  # bytes of a row its crc covers
SHARD_INDEX_SUFFIX = ".shards"


def _damaged(path: str, problem: str) -> IOError:
    return IOError(f"spill file damaged: {path}: {problem}")


@dataclasses.dataclass(frozen=True)
class SpillFile:
    """A written spill file, as Beam carries it: a name and a few offsets.

    The file is the framed records in key order, then a footer at
    ``index_offset``: every key (16 bytes each), every record's length (u32
    LE each), then the bucket table (`BUCKET_ROW` per bucket). Everything
    per bucket stays in the file, so what the runner holds per spill file
    does not grow with the number of buckets.
    """

    path: str
    num_records: int
    index_offset: int
    num_buckets: int
    table_crc: int  # crc32c of the whole bucket table

    @property
    def table_offset(self) -> int:
        return self.index_offset + self.num_records * SHARDS.spill_index_bytes

    def read_rows(self, f, lo: int, hi: int, crc: int) -> np.ndarray:
        """Rows ``[lo, hi)`` of the bucket table, read from ``f`` (this file,
        open) and checked against ``crc``."""
        size = (hi - lo) * BUCKET_ROW.itemsize
        f.seek(self.table_offset + lo * BUCKET_ROW.itemsize)
        data = f.read(size)
        if len(data) != size:
            raise _damaged(self.path, "ends early (its bucket table is cut short)")
        if google_crc32c.value(data) != crc:
            raise _damaged(self.path, f"bucket table checksum mismatch in rows {lo}-{hi}")
        return np.frombuffer(data, BUCKET_ROW)

    def read_table(self) -> np.ndarray:
        """The whole bucket table, checked."""
        with storage.open_read(self.path) as f:
            return self.read_rows(f, 0, self.num_buckets, self.table_crc)

    def bucket_sizes(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bucket ids, records, shard bytes) of every bucket in ``table``, int64."""
        firsts = np.r_[table["first"].astype(np.int64), self.num_records]
        ends = table["end"].astype(np.int64)
        return table["bucket"].astype(np.int64), np.diff(firsts), np.diff(np.r_[0, ends])

    @property
    def shard_index_path(self) -> str:
        """Where `write_shard_index` puts this file's range of each shard."""
        return self.path + SHARD_INDEX_SUFFIX

    def shard_range(self, shard: int) -> "SpillRange | None":
        """This file's range of ``shard`` (None if the shard takes none of it),
        from row ``shard`` of its shard index."""
        with storage.open_read(self.shard_index_path) as f:
            f.seek(shard * SHARD_ROW.itemsize)
            data = f.read(SHARD_ROW.itemsize)
        if len(data) != SHARD_ROW.itemsize:
            raise _damaged(self.path, f"its shard index ends before shard {shard}")
        row = np.frombuffer(data, SHARD_ROW)[0]
        if google_crc32c.value(data[:_SHARD_ROW_CHECKED]) != row["crc"]:
            raise _damaged(self.path, f"shard index checksum mismatch for shard {shard}")
        lo, hi = int(row["lo"]), int(row["hi"])
        if lo == hi:
            return None
        return SpillRange(self, lo, hi, int(row["start"]), int(row["first"]),
                          int(row["stop"]), int(row["rows_crc"]))


@dataclasses.dataclass(frozen=True)
class SpillRange:
    """Buckets of a spill file that go to one shard: rows ``[lo, hi)`` of its
    bucket table, records ``[first, stop)``, bytes from ``start``.

    Scalars only: the merge reads the rows it needs (`SpillFile.read_rows`).
    """

    spill: SpillFile
    lo: int
    hi: int
    start: int
    first: int
    stop: int
    rows_crc: int

    @property
    def path(self) -> str:
        return self.spill.path

    def __len__(self) -> int:
        return self.stop - self.first

    def read_buckets(self, f) -> "_Buckets":
        """This range's rows of the bucket table, read from ``f`` (its file, open)."""
        rows = self.spill.read_rows(f, self.lo, self.hi, self.rows_crc)
        return _Buckets(np.r_[rows["first"].astype(np.int64), self.stop],
                        rows["end"].astype(np.int64), rows["crc"].astype(np.int64),
                        rows["index_crc"].astype(np.int64))

    def read_index(self, f, buckets: "_Buckets") -> tuple[np.ndarray, np.ndarray]:
        """(keys uint8 [n, 16], end offset of each record) of this range, checked."""
        first, last = self.first, self.stop
        spill = self.spill
        f.seek(spill.index_offset + first * KEY_BYTES)
        key_bytes = f.read((last - first) * KEY_BYTES)
        f.seek(spill.index_offset + spill.num_records * KEY_BYTES + first * 4)
        length_bytes = f.read((last - first) * 4)
        if len(key_bytes) + len(length_bytes) != (last - first) * SHARDS.spill_index_bytes:
            raise _damaged(self.path, "ends early (its index is cut short)")
        rel = (buckets.bounds - first).tolist()
        for i, crc in enumerate(buckets.index_crcs.tolist()):
            a, b = rel[i], rel[i + 1]
            if google_crc32c.extend(google_crc32c.value(key_bytes[a * KEY_BYTES:b * KEY_BYTES]),
                                    length_bytes[a * 4:b * 4]) != crc:
                raise _damaged(self.path, "index checksum mismatch "
                               f"for records {first + a}-{first + b}")
        keys = np.frombuffer(key_bytes, np.uint8).reshape(-1, KEY_BYTES)
        ends = self.start + np.cumsum(np.frombuffer(length_bytes, "<u4").astype(np.int64))
        return keys, ends


@dataclasses.dataclass(frozen=True)
class _Buckets:
    """A range's buckets, read from its rows: their first records (then the
    range's stop), end offsets and checksums, int64."""

    bounds: np.ndarray
    ends: np.ndarray
    crcs: np.ndarray
    index_crcs: np.ndarray


def write_spill(path: str, buckets: np.ndarray, keys: np.ndarray, data,
                lengths: np.ndarray) -> SpillFile:
    """Writes one spill file: framed records already in key order, then its footer.

    ``buckets`` [n] and ``keys`` [n, 16] are the records' in the same order,
    ``data`` the records back to back (bytes or uint8) and ``lengths`` [n]
    each one's bytes.
    """
    lengths = np.asarray(lengths, np.int64)
    if not in_key_order(keys):
        raise ValueError(f"{path}: records not in key order")
    key_bytes = np.ascontiguousarray(keys).tobytes()
    length_bytes = lengths.astype("<u4").tobytes()
    ends = np.cumsum(lengths)
    data = np.frombuffer(data, np.uint8)  # slices of it are views, not copies
    ids, first = np.unique(buckets, return_index=True)
    bounds = np.r_[first, len(lengths)].astype(np.int64)
    offsets = np.r_[0, ends][bounds].tolist()
    at = bounds.tolist()
    crcs, index_crcs = [], []
    for i in range(len(ids)):
        crcs.append(google_crc32c.value(data[offsets[i]:offsets[i + 1]]))
        index_crcs.append(google_crc32c.extend(
            google_crc32c.value(key_bytes[at[i] * KEY_BYTES:at[i + 1] * KEY_BYTES]),
            length_bytes[at[i] * 4:at[i + 1] * 4]))
    table = np.zeros(len(ids), BUCKET_ROW)
    table["bucket"], table["first"], table["end"] = ids, first, offsets[1:]
    table["crc"], table["index_crc"] = crcs, index_crcs
    table_bytes = table.tobytes()
    with storage.open_uncached(path) as f:
        for part in (data, key_bytes, length_bytes, table_bytes):
            f.write(part)
    return SpillFile(path, len(lengths), len(data), len(ids), google_crc32c.value(table_bytes))


def shard_index(spill: SpillFile, table: np.ndarray, shards: np.ndarray,
                num_shards: int) -> np.ndarray:
    """`SHARD_ROW` s: the range of ``spill`` that shard s takes, given the
    shard of each row of its bucket ``table`` (in bucket order, so
    non-decreasing: a shard is a contiguous run of buckets)."""
    shards = np.asarray(shards, np.int64)
    if np.any(np.diff(shards) < 0):
        raise ValueError(f"{spill.path}: shards out of bucket order")
    wanted = np.arange(num_shards)
    lo, hi = np.searchsorted(shards, wanted, "left"), np.searchsorted(shards, wanted, "right")
    firsts = np.r_[table["first"].astype(np.int64), spill.num_records]
    ends = np.r_[0, table["end"].astype(np.int64)]
    rows = np.zeros(num_shards, SHARD_ROW)
    rows["lo"], rows["hi"], rows["start"] = lo, hi, ends[lo]
    rows["first"], rows["stop"] = firsts[lo], firsts[hi]
    table_bytes, width = table.tobytes(), BUCKET_ROW.itemsize
    rows["rows_crc"] = [google_crc32c.value(table_bytes[a * width:b * width])
                        for a, b in zip(lo.tolist(), hi.tolist())]
    data = rows.tobytes()
    rows["crc"] = [google_crc32c.value(data[i:i + _SHARD_ROW_CHECKED])
                   for i in range(0, len(data), SHARD_ROW.itemsize)]
    return rows


def write_shard_index(spill: SpillFile, rows: np.ndarray) -> None:
    """Writes `shard_index`'s rows beside the spill file."""
    storage.write_bytes(spill.shard_index_path, rows.tobytes())


class _RangeReader:
    """Reads a spill range front to back, checking each bucket's crc32c."""

    def __init__(self, f, spill: SpillRange):
        self._f, self._path = f, spill.path
        self._buckets = spill.read_buckets(f)
        self.keys, self.ends = spill.read_index(f, self._buckets)
        self.start = self.offset = spill.start  # offset: read up to here
        self._crc = 0
        self._check = 0
        f.seek(spill.start)

    def read(self, end: int) -> bytes:
        """The bytes from the current offset to ``end``."""
        path = self._path
        data = self._f.read(end - self.offset)
        if len(data) != end - self.offset:
            raise IOError(f"spill file damaged: {path}: ends {end - self.offset - len(data)} "
                          f"bytes early, at byte {self.offset + len(data)}")
        at = self.offset
        view = np.frombuffer(data, np.uint8)  # slices of it are views, not copies
        check_ends, crcs = self._buckets.ends, self._buckets.crcs
        while at < end:
            stop = min(end, int(check_ends[self._check]))
            self._crc = google_crc32c.extend(self._crc, view[at - self.offset:stop - self.offset])
            if stop == check_ends[self._check]:
                if self._crc != crcs[self._check]:
                    begin = int(check_ends[self._check - 1]) if self._check else \
                        self.start
                    raise IOError(f"spill file damaged: {path}: checksum mismatch in "
                                  f"bytes {begin}-{stop}")
                self._crc, self._check = 0, self._check + 1
            at = stop
        self.offset = end
        return data


def _items(buffer, size: int) -> np.ndarray:
    """``buffer`` as items of ``size`` bytes, one starting at every byte offset."""
    return np.ndarray((max(len(buffer) - size + 1, 0),), np.dtype((np.void, size)),
                      buffer, 0, (1,))


def gather_records(buffers: dict, src: np.ndarray, at: np.ndarray, sizes: np.ndarray
                   ) -> np.ndarray:
    """Record ``k`` is ``buffers[src[k]][at[k]:at[k] + sizes[k]]``: all of them
    back to back, in ``k`` order, as uint8.

    The records of one source and one size move in one numpy assignment of
    ``size``-byte items addressed by byte offset, so the Python work per
    block is per (source, size) pair, not per record: a shard's records
    mostly share one size (only a varint's width varies).
    """
    out = np.empty(int(sizes.sum()), np.uint8)
    out_at = np.cumsum(sizes) - sizes
    sizes_seen, size_of = np.unique(sizes, return_inverse=True)
    group = src.astype(np.int64) * len(sizes_seen) + size_of.reshape(-1)
    order = np.argsort(group, kind="stable")
    groups, firsts = np.unique(group[order], return_index=True)
    for g, members in zip(groups.tolist(), np.split(order, firsts[1:])):
        r, which = divmod(g, len(sizes_seen))
        size = int(sizes_seen[which])
        _items(out, size)[out_at[members]] = _items(buffers[r], size)[at[members]]
    return out


def merge_spill_ranges(ranges: Sequence[SpillRange], memory_bytes: int
                       ) -> Iterator[tuple[np.ndarray, int]]:
    """Yields (framed records, count) blocks of the key-order merge of ``ranges``.

    The merged order is one numpy sort of the ranges' keys; blocks of about
    ``memory_bytes`` then take each range's next records with one read, so
    memory stays flat whatever the shard size, and `gather_records` moves
    the bytes read into merged order.
    """
    ranges = [r for r in ranges if len(r)]
    if not ranges:
        return
    with contextlib.ExitStack() as stack:
        readers = [_RangeReader(stack.enter_context(storage.open_read(r.path)), r)
                   for r in ranges]
        keys = np.concatenate([r.keys for r in readers])
        source = np.repeat(np.arange(len(ranges)), [len(r) for r in ranges])
        ends = np.concatenate([r.ends for r in readers])
        starts = np.concatenate([np.r_[r.start, r.ends[:-1]] for r in readers])
        order = key_order(keys)
        sizes = (ends - starts)[order]
        cuts = np.searchsorted(np.cumsum(sizes), np.arange(memory_bytes, sizes.sum(),
                                                            memory_bytes), side="right")
        for block in np.split(order, cuts):
            if not len(block):
                continue
            src = source[block]
            last = np.full(len(ranges), -1, np.int64)
            np.maximum.at(last, src, block)
            base = np.fromiter((reader.offset for reader in readers), np.int64, len(readers))
            buffers = {r: readers[r].read(int(ends[last[r]]))
                       for r in np.flatnonzero(last >= 0).tolist()}
            yield gather_records(buffers, src, starts[block] - base[src],
                                 (ends - starts)[block]), len(block)
