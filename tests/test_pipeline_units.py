"""Pure functions of the pipeline, tested without a runner."""

import gzip
import http.server
import threading

import numpy as np
import pytest
import tensorflow as tf

import mnist_contract as contract
from mnist_contract import framing

from pipeline import batches, idx, records, sharding, sources
from pipeline.download import fetch
from pipeline.errors import PipelineInputError


# --- IDX -------------------------------------------------------------------

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
    with pytest.raises(PipelineInputError, match=r"^imgs: wrong IDX magic number 0x00000803 \(expected 0x00000801\)"):
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


# --- Records (encoding and framing: tests/test_contract.py) ------------------

def _key(salt: str, split: str, index: int) -> bytes:
    return records.shuffle_keys(salt, split, np.array([index])).tobytes()


def test_shuffle_key_is_stable_and_salted():
    assert _key("s", "train", 5) == _key("s", "train", 5)
    assert _key("s", "train", 5) != _key("t", "train", 5)
    assert _key("s", "train", 5) != _key("s", "test", 5)
    keys = records.shuffle_keys("s", "train", np.arange(500))
    buckets = batches.buckets_of(keys, 4)
    assert set(buckets.tolist()) == set(range(16))
    # A bucket is the key's top bits.
    assert buckets.tolist() == [int.from_bytes(k[:4].tobytes(), "big") >> 28 for k in keys]


def test_shuffle_keys_are_distinct_and_give_an_unrelated_order():
    n = 100_000
    keys = records.shuffle_keys("s", "train", np.arange(n))
    assert keys.shape == (n, records.KEY_BYTES)
    assert keys[123].tobytes() == _key("s", "train", 123)  # batch-independent
    first = keys[:, :8].copy().view(">u8").reshape(-1)
    assert len(np.unique(first)) == n  # a bijection of the index: no ties
    order = np.argsort(first)
    # The sorted order is unrelated to the index order or to another salt's.
    assert abs(np.corrcoef(order, np.arange(n))[0, 1]) < 0.02
    other = np.argsort(records.shuffle_keys("t", "train", np.arange(n))[:, :8].copy()
                       .view(">u8").reshape(-1))
    assert abs(np.corrcoef(order, other)[0, 1]) < 0.02
    # Neighbouring indices land far apart: each 1% of the order mixes the whole range.
    assert np.ptp(order[:n // 100]) > 0.95 * n


# --- Sharding --------------------------------------------------------------

def test_num_shards_formula():
    assert sharding.num_shards_for(1000, 100, 1, 10_000) == 10
    assert sharding.num_shards_for(1001, 100, 1, 10_000) == 11
    assert sharding.num_shards_for(50, 100, 4, 10_000) == 4
    assert sharding.num_shards_for(10**9, 100, 1, 3) == 3


def test_bucket_bits_grow_with_shards():
    assert sharding.bucket_bits_for(10**6, 10**8, 1) == sharding.MIN_BUCKET_BITS + 2
    assert sharding.bucket_bits_for(10**9, 10**8, 1) == 12
    assert sharding.bucket_bits_for(10**15, 10**8, 1) == sharding.MAX_BUCKET_BITS


def test_plan_shards_balances_bytes():
    rng = np.random.default_rng(1)
    sizes = {b: (1, int(s)) for b, s in enumerate(rng.integers(200, 400, 4096))}
    plan = sharding.plan_shards(sizes, target_shard_bytes=60_000, min_shards=1)
    total = sum(s for _, s in sizes.values())
    assert plan.num_shards == -(-total // 60_000)
    per_shard = np.zeros(plan.num_shards)
    for bucket, (_, size) in sizes.items():
        per_shard[plan.bucket_to_shard[bucket]] += size
    assert np.all(np.abs(per_shard / per_shard.mean() - 1) <= 0.10)
    # Buckets are contiguous ranges of the shuffle order: shards must be too.
    assert [plan.bucket_to_shard[b] for b in sorted(sizes)] == sorted(
        plan.bucket_to_shard.values())


def test_plan_shards_never_leaves_an_empty_shard():
    plan = sharding.plan_shards({0: (1, 10), 7: (1, 1000)}, target_shard_bytes=1,
                                min_shards=2)
    assert plan.num_shards == 2
    plan = sharding.plan_shards({3: (5, 1000)}, target_shard_bytes=10, min_shards=1)
    assert plan.num_shards == 1 and plan.bucket_to_shard == {3: 0}


# --- Contract --------------------------------------------------------------

def test_shard_names():
    name = contract.shard_filename("train", 3, 12)
    assert name == "mnist-train.tfrecord-00003-of-00012"
    assert contract.parse_shard_filename(name) == ("mnist", "train", 3, 12)
    with pytest.raises(contract.ContractError):
        contract.parse_shard_filename("mnist-train.tfrecord-3-of-12")


def _manifest(shards):
    return contract.Manifest("mnist", "raw", "none", {
        "train": contract.SplitInfo("train", tuple(shards))})


def test_manifest_round_trip_and_validation():
    shards = [contract.ShardInfo(contract.shard_filename("train", i, 2), 5, 5000, "ab" * 32)
              for i in range(2)]
    manifest = _manifest(shards)
    parsed = contract.Manifest.from_json(manifest.to_json())
    assert parsed == manifest and parsed.split("train").num_examples == 10
    with pytest.raises(contract.ContractError, match=r"^m\.json: split 'train' lists"):
        contract.Manifest.from_json(_manifest(shards[:1]).to_json(), "m.json")
    with pytest.raises(contract.ContractError, match="not valid JSON"):
        contract.Manifest.from_json("{", "m.json")
    with pytest.raises(contract.ContractError, match="split 'test' not in manifest"):
        manifest.split("test")


# --- Sources ---------------------------------------------------------------

def test_synthetic_is_deterministic_and_task_partitioned():
    source = sources.parse_source("synthetic:25000")
    tasks = source.read_tasks("train")
    assert tasks == [(0, 10_000), (10_000, 20_000), (20_000, 25_000)]
    a = next(source.read("train", tasks[1]))
    b = next(source.read("train", tasks[1]))
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.indices, np.arange(10_000, 20_000))
    assert source.estimated_examples("test") == 25000 // 6
    assert set(np.unique(a.labels)) == set(range(10))


def test_sample_source_splits_real_digits():
    source = sources.parse_source("sample")
    train = next(source.read("train", None))
    test = next(source.read("test", None))
    assert len(train.labels) == 4000 and len(test.labels) == 1000
    assert np.bincount(test.labels).tolist() == [100] * 10
    assert train.images.dtype == np.uint8 and train.images.max() > 200


@pytest.mark.parametrize("spec", ["synthetic:0", "synthetic:x", ""])
def test_parse_source_rejects(spec):
    with pytest.raises(PipelineInputError):
        sources.parse_source(spec)


def test_https_source_downloads_once_into_cache(tmp_path, idx_dir, digits):
    """The IDX source over HTTP(S), against a local server; then from cache."""
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(idx_dir), **kw)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    source = sources.parse_source(url, cache_dir=str(tmp_path / "cache"))
    try:
        source.check()
    finally:
        server.shutdown()
        server.server_close()
    batch = next(source.read("test", None))  # server is gone: the cache serves it
    np.testing.assert_array_equal(batch.images, digits["test"][0])
    with pytest.raises(PipelineInputError, match="download failed"):
        fetch(url + "missing.gz", str(tmp_path / "cache"), timeout_s=2)
