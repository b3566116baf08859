"""`mnist_contract.wire`'s TF-free Example reader: the encoder's inverse, TensorFlow's equal."""

import numpy as np
import pytest
import tensorflow as tf

import mnist_contract as contract
from mnist_contract import examples, wire

KINDS = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def _batch(count, seed=3):
    rng = np.random.default_rng(seed)
    return {contract.IMAGE_KEY: rng.integers(0, 256, (count, 28, 28), dtype=np.uint8),
            contract.LABEL_KEY: rng.integers(0, contract.NUM_CLASSES, count),
            contract.INDEX_KEY: np.concatenate([[0, 127, 128, 2**63 - 1, -1, -(2**63)],
                                                rng.integers(0, 2**40, count - 6)])}


@pytest.mark.parametrize("image_format", contract.IMAGE_FORMATS)
def test_decoder_inverts_the_encoder_byte_for_byte(image_format):
    values = _batch(200)
    for i, record in enumerate(wire.encode_examples(values, image_format)):
        decoded = wire.decode_example(record, image_format)
        np.testing.assert_array_equal(decoded[contract.IMAGE_KEY],
                                      values[contract.IMAGE_KEY][i])
        assert decoded[contract.LABEL_KEY] == values[contract.LABEL_KEY][i]
        assert decoded[contract.INDEX_KEY] == values[contract.INDEX_KEY][i]
        again = wire.encode_examples({k: [v] if k != contract.IMAGE_KEY else v[None]
                                      for k, v in decoded.items()}, image_format)
        assert again == [record]


def _as_dict(example):
    out = {}
    for name, feature in example.features.feature.items():
        which = feature.WhichOneof("kind")
        out[name] = (KINDS.get(which, ""),
                     list(getattr(feature, which).value) if which else [])
    return out


def _odd_examples():
    """Examples no contract writer produces: other kinds, many or no values, merges."""
    rng = np.random.default_rng(5)
    made = []
    for i in range(60):
        feature = {}
        for j in range(int(rng.integers(0, 5))):
            kind = ["bytes", "float", "int64", "none"][int(rng.integers(0, 4))]
            n = int(rng.integers(0, 4))
            if kind == "bytes":
                f = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[rng.bytes(int(rng.integers(0, 300))) for _ in range(n)]))
            elif kind == "float":
                f = tf.train.Feature(float_list=tf.train.FloatList(
                    value=rng.normal(size=n).astype(np.float32).tolist()))
            elif kind == "int64":
                f = tf.train.Feature(int64_list=tf.train.Int64List(
                    value=rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64).tolist()))
            else:
                f = tf.train.Feature()
            feature[f"f{j}é" if j % 2 else f"f{j}"] = f
        made.append(tf.train.Example(features=tf.train.Features(feature=feature))
                    .SerializeToString())
    # Two serialized Examples concatenated are one Example, merged (later keys win).
    made.append(made[1] + made[2] + made[1])
    # Unpacked int64 values (older writers), a float given unpacked, unknown fields.
    label = b"\x0a\x05label" + b"\x12\x06" + b"\x1a\x04" + b"\x08\x03\x08\x04"
    flt = b"\x0a\x01x" + b"\x12\x07" + b"\x12\x05" + b"\x0d\x00\x00\x80\x3f"
    features = b"".join(b"\x0a" + bytes([len(e)]) + e for e in (label, flt))
    made.append(b"\x0a" + bytes([len(features)]) + features + b"\x10\x01")
    return made


def test_parse_example_equals_the_proto_library_and_parse_single_example():
    for serialized in _odd_examples():
        ours = wire.parse_example(serialized)
        assert ours == _as_dict(tf.train.Example.FromString(serialized))
        for name, (kind, values) in ours.items():
            if not kind:
                continue
            dtype = {"bytes": tf.string, "float": tf.float32, "int64": tf.int64}[kind]
            parsed = tf.io.parse_single_example(
                serialized, {name: tf.io.VarLenFeature(dtype)})[name].values.numpy()
            assert parsed.tolist() == values


def test_contract_records_decode_as_tensorflow_reads_them():
    values = _batch(50)
    for image_format in contract.IMAGE_FORMATS:
        for record in wire.encode_examples(values, image_format):
            ours = wire.decode_example(record, image_format)
            parsed = tf.io.parse_single_example(record, examples.parse_spec())
            theirs = examples.decode_example(record, image_format)
            np.testing.assert_array_equal(ours[contract.IMAGE_KEY],
                                          theirs[contract.IMAGE_KEY])
            assert ours[contract.LABEL_KEY] == int(parsed[contract.LABEL_KEY])
            assert ours[contract.INDEX_KEY] == int(parsed[contract.INDEX_KEY])


def test_damaged_bytes_fail_where_the_proto_library_fails():
    record = wire.encode_examples(_batch(6), "raw")[5]
    for cut in range(len(record)):
        try:
            expected = _as_dict(tf.train.Example.FromString(record[:cut]))
        except Exception:  # the proto library's DecodeError
            with pytest.raises(ValueError):
                wire.parse_example(record[:cut])
        else:
            assert wire.parse_example(record[:cut]) == expected, cut


def test_decode_names_what_is_wrong():
    record = wire.encode_examples(_batch(6), "raw")[0]
    with pytest.raises(ValueError, match="png image does not decode"):
        wire.decode_example(record, "png")
    rgb = tf.io.encode_png(tf.zeros((28, 28, 3), tf.uint8)).numpy()
    with pytest.raises(ValueError, match="mode RGB, expected 8-bit grayscale"):
        wire.decode_image(rgb, "png")
    wide = tf.io.encode_png(tf.zeros((28, 29, 1), tf.uint8)).numpy()
    with pytest.raises(ValueError, match=r"shape \(28, 29\), expected 28x28"):
        wire.decode_image(wide, "png")
    as_bytes = tf.train.Example.FromString(record)
    as_bytes.features.feature[contract.LABEL_KEY].Clear()
    as_bytes.features.feature[contract.LABEL_KEY].bytes_list.value.append(b"7")
    with pytest.raises(ValueError, match="'label' holds 0 int64 values, expected 1"):
        wire.decode_example(as_bytes.SerializeToString(), "raw")
