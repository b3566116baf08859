"""The IDX format (`pipeline.source.idx`): decoding, and one-line errors naming the file."""

import gzip

import numpy as np
import pytest

from pipeline.errors import PipelineInputError
from pipeline.source import idx


def test_idx_round_trip():
    images = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    labels = np.array([0, 9, 4], dtype=np.uint8)
    decoded_images, decoded_labels = idx.decode_split(
        gzip.compress(idx.encode_idx(images)), gzip.compress(idx.encode_idx(labels)),
        "i.gz", "l.gz")
    np.testing.assert_array_equal(decoded_images, images)
    np.testing.assert_array_equal(decoded_labels, labels)
    assert decoded_labels.dtype == np.int64


def test_idx_wrong_magic_names_file():
    data = idx.encode_idx(np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(PipelineInputError, match=r"^imgs: wrong IDX magic number 0x00000803 "
                                                 r"\(expected 0x00000801\)"):
        idx.decode_idx(data, idx.LABELS_MAGIC, "imgs")


def test_idx_size_mismatch():
    data = idx.encode_idx(np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(PipelineInputError, match=r"^f: IDX header promises"):
        idx.decode_idx(data[:-1], idx.IMAGES_MAGIC, "f")
    with pytest.raises(PipelineInputError, match="header cut short"):
        idx.decode_idx(data[:9], idx.IMAGES_MAGIC, "f")


def test_gunzip_truncated():
    packed = gzip.compress(b"x" * 10_000)
    with pytest.raises(PipelineInputError, match=r"^a\.gz: truncated or corrupt gzip"):
        idx.gunzip(packed[: len(packed) // 2], "a.gz")


def test_check_split_problems():
    images = np.zeros((3, 28, 28), np.uint8)
    with pytest.raises(PipelineInputError, match=r"^l: 2 labels for 3 images in i"):
        idx.check_split(images, np.zeros(2, np.uint8), "i", "l")
    with pytest.raises(PipelineInputError, match=r"^l: label 12 at index 1 is outside 0-9"):
        idx.check_split(images, np.array([1, 12, 3], np.uint8), "i", "l")
    with pytest.raises(PipelineInputError, match=r"^i: images are 28x27"):
        idx.check_split(np.zeros((3, 28, 27), np.uint8), np.zeros(3, np.uint8), "i", "l")
