"""The data contract (`mnist_contract`): spec, codec, framing and manifest, without a runner."""

import io
import json

import numpy as np
import pytest
import tensorflow as tf

import mnist_contract as contract
from mnist_contract import examples, framing, wire

from tests.trainer_data import write_dataset


def _values(image, label=7, index=1234):
    return {contract.IMAGE_KEY: image, contract.LABEL_KEY: label, contract.INDEX_KEY: index}


# --- Spec and codec ----------------------------------------------------------

@pytest.mark.parametrize("image_format", contract.IMAGE_FORMATS)
def test_example_round_trip_and_tf_parse(image_format):
    image = np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)
    serialized = examples.encode_example(_values(image), image_format)
    decoded = examples.decode_example(serialized, image_format)
    np.testing.assert_array_equal(decoded[contract.IMAGE_KEY], image)
    assert (decoded[contract.LABEL_KEY], decoded[contract.INDEX_KEY]) == (7, 1234)
    # The trainer's parse spec, derived from the same feature list, reads it.
    parsed = tf.io.parse_single_example(serialized, examples.parse_spec())
    assert set(parsed) == set(contract.FEATURE_NAMES)
    assert int(parsed[contract.LABEL_KEY]) == 7 and int(parsed[contract.INDEX_KEY]) == 1234


def test_encoding_is_deterministic_and_accepts_a_channel_axis():
    image = np.full((28, 28), 3, np.uint8)
    raw = examples.encode_example(_values(image, 1, 2), "raw")
    assert raw == examples.encode_example(_values(image.copy()[..., None], 1, 2), "raw")


def test_every_feature_of_the_spec_is_encoded_and_required():
    example = tf.train.Example.FromString(
        examples.encode_example(_values(np.zeros((28, 28), np.uint8)), "raw"))
    assert sorted(example.features.feature) == sorted(contract.FEATURE_NAMES)
    del example.features.feature[contract.INDEX_KEY]
    with pytest.raises(ValueError, match="lacks feature 'index'"):
        examples.decode_example(example.SerializeToString(), "raw")


def test_decode_refuses_bad_values():
    good = examples.encode_example(_values(np.zeros((28, 28), np.uint8), label=9), "raw")
    example = tf.train.Example.FromString(good)
    example.features.feature[contract.LABEL_KEY].int64_list.value[:] = [10]
    with pytest.raises(ValueError, match="label 10 outside 0..9"):
        examples.decode_example(example.SerializeToString(), "raw")
    with pytest.raises(ValueError, match="raw image has"):
        examples.decode_image(b"x", "raw")
    with pytest.raises(ValueError, match="expected 28x28"):
        examples.encode_image(np.zeros((27, 28), np.uint8), "raw")


def test_manifest_feature_description_follows_the_spec():
    described = contract.feature_spec_description("png")
    assert list(described) == list(contract.FEATURE_NAMES)
    assert described["image"] == {"kind": "bytes", "shape": [28, 28, 1], "dtype": "uint8",
                                  "encoding": "png"}
    assert described["label"]["num_classes"] == 10


def test_tfds_features_follow_the_spec():
    from pipeline.publish.metadata import tfds_features
    for image_format in contract.IMAGE_FORMATS:
        features = tfds_features(image_format)
        assert list(features.keys()) == list(contract.FEATURE_NAMES)
        assert features["label"].num_classes == contract.NUM_CLASSES
        assert tuple(features["image"].shape) == contract.IMAGE_SHAPE


@pytest.mark.parametrize("image_format, count", [("raw", 3000), ("png", 300)])
def test_wire_encoder_equals_tf_serialization(image_format, count):
    """The batch encoder writes exactly what the proto library writes, deterministically."""
    rng = np.random.default_rng(11)
    images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
    images[: count // 3] = np.where(images[: count // 3] > 200, images[: count // 3], 0)
    labels = rng.integers(0, contract.NUM_CLASSES, count)
    # Indices of every varint length, from 1 byte up to the 10 of a negative int64.
    indices = np.concatenate([
        np.array([0, 1, 127, 128, 16_383, 16_384, 2**31, 2**63 - 1, -1, -(2**63)]),
        rng.integers(0, 2**rng.integers(1, 62, count - 10))])
    ours = wire.encode_examples({contract.IMAGE_KEY: images, contract.LABEL_KEY: labels,
                                 contract.INDEX_KEY: indices}, image_format)
    theirs = [examples.encode_example(_values(image, int(label), int(index)), image_format)
              for image, label, index in zip(images, labels, indices)]
    assert len(ours) == count and ours == theirs


def test_fixed_width_rows_equal_the_batch_encoder():
    """`wire.encode_example_rows` gives each record's exact bytes, grouped by length."""
    rng = np.random.default_rng(12)
    count = 2000
    images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, contract.NUM_CLASSES, count)
    indices = rng.permutation(np.r_[np.arange(100, 140), np.arange(16_300, 16_400),
                                    rng.integers(0, 2**40, count - 140), [-1]][:count])
    values = {contract.IMAGE_KEY: images, contract.LABEL_KEY: labels,
              contract.INDEX_KEY: indices}
    expected = wire.encode_examples(values, "raw")
    blocks = wire.encode_example_rows(values, "raw")
    assert len({block.shape[1] for _, block in blocks}) == len(blocks) > 3
    got = {}
    for positions, block in blocks:
        got.update({at: row.tobytes() for at, row in zip(positions.tolist(), block)})
    assert [got[i] for i in range(count)] == expected
    assert wire.encode_example_rows(values, "png") is None


def test_frame_rows_equals_frame_records():
    rows = np.random.default_rng(13).integers(0, 256, (50, 37), dtype=np.uint8)
    framed = framing.frame_rows(rows)
    assert [row.tobytes() for row in framed] == framing.frame_records(
        [row.tobytes() for row in rows])
    assert framing.frame_rows(np.zeros((0, 5), np.uint8)).shape == (0, 21)


def test_wire_varints_match_the_single_value_encoder():
    values = np.array([0, 1, 127, 128, 300, 2**35, 2**63 - 1, -1, -300])
    assert wire.varints(values) == [wire.varint(int(v)) for v in values]
    assert wire.varint(300) == b"\xac\x02" and len(wire.varint(-1)) == 10


# --- Framing -------------------------------------------------------------------

def test_frame_record_matches_tf_writer_and_streams_back(tmp_path):
    payloads = [b"", b"a", bytes(range(256)) * 5]
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for p in payloads:
            writer.write(p)
    ours = b"".join(framing.frame_record(p) for p in payloads)
    assert ours == (tmp_path / "x.tfrecord").read_bytes()
    assert b"".join(framing.frame_records(payloads)) == ours  # the batch form
    assert framing.frame_records([]) == []
    # Chunks smaller than a record, and a byte range of a longer stream.
    for chunk in (1, 7, 1 << 20):
        assert list(framing.iter_records(io.BytesIO(ours), "x", chunk_bytes=chunk)) == payloads
    first_two = len(framing.frame_record(b"")) + len(framing.frame_record(b"a"))
    assert list(framing.iter_records(io.BytesIO(ours + b"junk"), "x", limit=first_two,
                                     chunk_bytes=5)) == payloads[:2]


def test_framing_detects_damage_and_truncation():
    framed = framing.frame_record(b"hello") + framing.frame_record(b"world")
    damaged = bytearray(framed)
    damaged[14] ^= 0xFF
    with pytest.raises(framing.FramingError, match="x: bad data CRC in record at byte 0"):
        list(framing.iter_records(io.BytesIO(bytes(damaged)), "x"))
    damaged = bytearray(framed)
    damaged[21 + 2] ^= 0xFF
    with pytest.raises(framing.FramingError, match="x: bad length CRC at byte 21"):
        list(framing.iter_records(io.BytesIO(bytes(damaged)), "x", chunk_bytes=3))
    with pytest.raises(framing.FramingError, match="x: truncated"):
        list(framing.iter_records(io.BytesIO(framed[:-3]), "x"))
    with pytest.raises(framing.FramingError, match="ends 3 bytes early"):
        list(framing.iter_records(io.BytesIO(framed[:-3]), "x", limit=len(framed)))


# --- Manifest ------------------------------------------------------------------

@pytest.fixture(scope="module")
def manifest_dict(tmp_path_factory):
    manifest = write_dataset(str(tmp_path_factory.mktemp("ds")), num_train=40, num_test=9,
                             train_shards=2, test_shards=1, write_manifest=False)
    return json.loads(manifest.to_json())


def _load(raw):
    text = raw if isinstance(raw, (str, bytes)) else json.dumps(raw)
    return contract.Manifest.from_json(text, "M")


def test_manifest_round_trip(manifest_dict):
    manifest = _load(manifest_dict)
    assert manifest.split("train").num_examples == 40
    assert json.loads(manifest.to_json()) == manifest_dict


@pytest.mark.parametrize("text, message", [
    ("[]", "top level must be a JSON object, not list"),
    ("null", "top level must be a JSON object, not NoneType"),
    ('"x"', "top level must be a JSON object, not str"),
    (b"\xff\xfe{", "not UTF-8 text"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    ("{", "not valid JSON"),
])
def test_manifest_that_is_not_an_object(text, message):
    with pytest.raises(contract.ContractError, match=f"^M: ({message})"):
        _load(text)


def _edit(manifest_dict, path, value):
    raw = json.loads(json.dumps(manifest_dict))
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return raw


SHARD0 = ("splits", "train", "shards", 0)


@pytest.mark.parametrize("path, value, message", [
    (SHARD0 + ("num_examples",), True, "'num_examples' must be an integer, not true"),
    (SHARD0 + ("num_examples",), 20.9, "'num_examples' must be an integer, not 20.9"),
    (SHARD0 + ("num_examples",), "20", "'num_examples' must be an integer"),
    (SHARD0 + ("num_examples",), -1, "num_examples must be >= 1"),
    (SHARD0 + ("num_examples",), 10**9, "cannot fit in"),
    (SHARD0 + ("num_bytes",), 0, "num_bytes must be >= 1"),
    (SHARD0 + ("sha256",), "abc", "sha256 is not 64 hex digits"),
    (SHARD0 + ("file",), "mnist-train.tfrecord-00000-of-00002\n", "not a shard file name"),
    (SHARD0 + ("file",), "mnist-test.tfrecord-00000-of-00002", "lists mnist-test"),
    (("splits",), [], "'splits' must be an object"),
    (("splits", "train"), [], "must be an object"),
    (("splits", "train", "shards"), [], "lists no shards"),
    (("splits", "train", "num_examples"), 41, "says 41 examples but its shards add up to 40"),
    (("format_version",), True, "unsupported format_version"),
    (("image_format",), "jpeg", "unknown image_format"),
    (("dataset",), 3, "'dataset' must be a string"),
])
def test_manifest_is_strict(manifest_dict, path, value, message):
    with pytest.raises(contract.ContractError, match=message) as info:
        _load(_edit(manifest_dict, path, value))
    assert str(info.value).startswith("M: ") and "\n" not in str(info.value)


def test_shard_names_are_matched_whole():
    with pytest.raises(contract.ContractError):
        contract.parse_shard_filename("mnist-train.tfrecord-00000-of-00001\n")
    assert contract.parse_shard_filename("mnist-train.tfrecord-00000-of-00001") == (
        "mnist", "train", 0, 1)


# --- Shard names and the manifest ------------------------------------------

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


# --- Record sizes ------------------------------------------------------------

@pytest.mark.parametrize("image_format, tolerance", [("raw", 0.0), ("png", 0.02)])
def test_record_sizes_match_real_digits(image_format, tolerance):
    """`RECORD_SIZES`: no real record is below the smallest, and the typical is their mean."""
    from tests.helpers import real_digits
    images, labels = real_digits(2000)
    indices = np.arange(50_000, 52_000)  # at MNIST's indices, as the full train split has
    encoded = wire.encode_examples({contract.IMAGE_KEY: images, contract.LABEL_KEY: labels,
                                    contract.INDEX_KEY: indices}, image_format)
    sizes = np.array([len(record) for record in framing.frame_records(encoded)])
    size = contract.RECORD_SIZES[image_format]
    assert sizes.min() >= size.smallest
    assert abs(sizes.mean() / size.typical - 1) <= tolerance, sizes.mean()
