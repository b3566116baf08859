"""The IDX source streams its gzip files: same rows as decoding whole, flat memory."""

import gzip
import io
import zlib

import numpy as np
import pytest

from pipeline.source import idx
from pipeline.source import sources
from pipeline.errors import PipelineInputError
from tests.helpers import write_idx_split


class CountingReader(io.BytesIO):
    """A stream that records how far it has been read."""

    high_water = 0

    def read(self, n=-1):
        data = super().read(n)
        self.high_water = max(self.high_water, self.tell())
        return data


def _gz(array):
    return gzip.compress(idx.encode_idx(array), mtime=0)


def test_stream_equals_whole_file_decoding(digits):
    images, labels = digits["train"]
    whole_images, whole_labels = idx.decode_split(_gz(images), _gz(labels), "i", "l")
    blocks = list(idx.stream_split(io.BytesIO(_gz(images)), io.BytesIO(_gz(labels)),
                                   "i", "l", rows=7))
    assert [start for start, _, _ in blocks] == list(range(0, 360, 7))
    np.testing.assert_array_equal(np.concatenate([b for _, b, _ in blocks]), whole_images)
    np.testing.assert_array_equal(np.concatenate([b for _, _, b in blocks]), whole_labels)


def test_stream_reads_only_as_far_as_it_has_yielded():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3000, 28, 28), dtype=np.uint8)  # incompressible
    labels = rng.integers(0, 10, 3000).astype(np.uint8)
    raw = CountingReader(_gz(images))
    blocks = idx.stream_split(raw, io.BytesIO(_gz(labels)), "i", "l", rows=100)
    next(blocks)
    assert raw.high_water < len(raw.getvalue()) // 4


@pytest.mark.parametrize("case, message", [
    ("truncated", "i: truncated or corrupt gzip data"),
    ("extra bytes", "i: IDX header promises (20, 28, 28) but the file has more bytes"),
    ("short", "i: IDX header promises (20, 28, 28) but the data ends 784 bytes early"),
    ("label", "l: label 12 at index 13 is outside 0-9"),
    ("count", "l: 19 labels for 20 images in i"),
    ("images header over", "i: IDX header promises (21, 28, 28) but the data ends 784 "
                           "bytes early"),
    ("labels header over", "l: IDX header promises (21,) but the data ends 1 bytes early"),
    ("images header under", "i: IDX header promises (19, 28, 28) but the file has more "
                            "bytes"),
])
def test_stream_errors_name_the_file(case, message):
    images = np.zeros((20, 28, 28), np.uint8)
    labels = np.zeros(20, np.uint8)
    images_gz, labels_gz = _gz(images), _gz(labels)
    if case == "truncated":
        images_gz = images_gz[:-30]
    elif case == "extra bytes":
        images_gz = gzip.compress(idx.encode_idx(images) + b"\0", mtime=0)
    elif case == "short":
        images_gz = gzip.compress(idx.encode_idx(images)[:-784], mtime=0)
    elif case == "label":
        labels[13] = 12
        labels_gz = _gz(labels)
    elif case == "count":
        labels_gz = _gz(labels[:-1])
    elif case.endswith("header over") or case.endswith("header under"):
        claimed = 21 if case.endswith("over") else 19
        raw = bytearray(idx.encode_idx(images if case.startswith("images") else labels))
        raw[4:8] = claimed.to_bytes(4, "big")
        if case.startswith("images"):
            images_gz = gzip.compress(bytes(raw), mtime=0)
        else:
            labels_gz = gzip.compress(bytes(raw), mtime=0)
    with pytest.raises(PipelineInputError) as error:
        list(idx.stream_split(io.BytesIO(images_gz), io.BytesIO(labels_gz), "i", "l",
                              rows=6))
    assert message in str(error.value)


def test_idx_source_yields_batches_in_order(tmp_path, digits, monkeypatch):
    monkeypatch.setattr(sources, "BATCH", 100)
    write_idx_split(tmp_path, "train", *digits["train"])
    batches = list(sources.IdxSource(str(tmp_path)).read("train", None))
    assert [len(b.indices) for b in batches] == [100, 100, 100, 60]
    np.testing.assert_array_equal(np.concatenate([b.indices for b in batches]),
                                  np.arange(360))
    np.testing.assert_array_equal(np.concatenate([b.images for b in batches]),
                                  digits["train"][0])


_DATA = np.random.default_rng(5).bytes(5000) + b"a" * 300_000  # long enough for many pieces


@pytest.mark.parametrize("stored", [
    gzip.compress(_DATA), gzip.compress(_DATA) + gzip.compress(b"xyz"),  # two members
    gzip.compress(_DATA) + b"\0" * 10, b""])  # zero padding at the end, an empty stream
@pytest.mark.parametrize("n", [1, 4096, 1 << 30])
def test_gzip_reader_reads_what_gzip_reads(stored, n, monkeypatch):
    monkeypatch.setattr(idx.GzipReader, "PIECE", 1000)
    reader, parts = idx.GzipReader(io.BytesIO(stored)), []
    while part := reader.read(n):
        assert len(part) <= n
        parts.append(part)
    assert b"".join(parts) == gzip.decompress(stored)
    assert n == 1 or all(len(part) == n for part in parts[:-1])


@pytest.mark.parametrize("stored, error", [
    (gzip.compress(_DATA)[:-30], EOFError),  # cut inside the member
    (gzip.compress(_DATA)[:-3], EOFError),  # cut inside the trailer
    (gzip.compress(_DATA)[:-8] + b"\0" * 8, zlib.error),  # wrong CRC and length
    (b"not gzip", zlib.error), (gzip.compress(_DATA) + b"junk", zlib.error)])
def test_gzip_reader_refuses_what_gzip_refuses(stored, error):
    with pytest.raises((EOFError, OSError)):
        gzip.decompress(stored)
    with pytest.raises(error):
        idx.GzipReader(io.BytesIO(stored)).read(1 << 30)
