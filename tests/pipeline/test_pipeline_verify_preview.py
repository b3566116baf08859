"""`python -m pipeline.verify OUTPUT --preview=FILE.png`: a picture drawn from the records."""

import gzip
import io
import uuid

import numpy as np
import pytest
from PIL import Image

import mnist_contract as contract
from mnist_contract import framing, wire
from pipeline import preview, storage
from pipeline.verify import main
from tests.helpers import EMULATOR_BUCKET, run_job


def stored_records(output, split, image_format):
    """Every record of ``split`` decoded, shard 0 first, in file order."""
    manifest = contract.Manifest.from_json(
        storage.read_bytes(contract.join_path(output, contract.MANIFEST_FILE)))
    out = []
    for shard in manifest.split(split).shards:
        data = storage.read_bytes(contract.join_path(output, shard.file))
        if manifest.compression == "gzip":
            data = gzip.decompress(data)
        out.extend(wire.decode_example(r, image_format)
                   for r in framing.iter_records(io.BytesIO(data), shard.file))
    return out


def check_preview(png_path, output, count, image_format="raw"):
    pixels = np.asarray(Image.open(png_path))
    width, height = preview.size(len(contract.SPLITS), count)
    assert pixels.shape == (height, width)
    for section, split in enumerate(contract.SPLITS):
        records = stored_records(output, split, image_format)
        for k, values in enumerate(records[:count]):
            x, y = preview.cell_origin(section, k, count)
            cell = pixels[y:y + preview.CELL, x:x + preview.CELL]
            expected = np.kron(values[contract.IMAGE_KEY],
                               np.ones((preview.SCALE, preview.SCALE), np.uint8))
            np.testing.assert_array_equal(cell, expected, err_msg=f"{split} cell {k}")
        labels = np.bincount([v[contract.LABEL_KEY] for v in records], minlength=10)
        check_histogram(pixels, section, count, labels)


def check_histogram(pixels, section, count, labels):
    """Each digit's bar is as tall as its share of the tallest (counted at its right
    edge, where no caption reaches)."""
    base = (preview.MARGIN + section * preview.section_height(count) + preview.TEXT
            + preview.grid_rows(count) * (preview.CELL + preview.TEXT + preview.GAP)
            + preview.TEXT + preview.BARS)
    for digit, n in enumerate(labels):
        x = preview.MARGIN + digit * preview.PITCH + preview.CELL - 2
        column = pixels[base - preview.BARS:base, x]
        assert (column == preview.BAR).sum() == round(preview.BARS * n / labels.max()), digit


@pytest.mark.parametrize("count, flags", [(10, ["--min_shards=3"]),
                                          (13, ["--image_format=png", "--compression=gzip"])])
def test_preview_cells_are_the_stored_records(tmp_path, idx_dir, capsys, count, flags):
    out = str(tmp_path / "out")
    run_job([f"--source={idx_dir}", f"--output={out}", "--runner=DirectRunner",
             "--allow_extreme_sharding", *flags])
    png = tmp_path / "preview.png"
    argv = [out, f"--preview={png}"] + ([] if count == 10 else [f"--preview_count={count}"])
    assert main(argv) == 0
    assert f"preview of the first {count} examples of each split -> {png}" in \
        capsys.readouterr().out
    check_preview(png, out, count, "png" if "--image_format=png" in flags else "raw")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_preview_of_a_gcs_dataset(gcs_emulator, idx_dir, tmp_path):
    out = f"gs://{EMULATOR_BUCKET}/preview/{uuid.uuid4().hex[:8]}"
    run_job([f"--source={idx_dir}", f"--output={out}", "--runner=DirectRunner",
             "--min_shards=2", "--allow_extreme_sharding"])
    png = tmp_path / "preview.png"
    assert main([out, f"--preview={png}", "--preview_count=4"]) == 0
    check_preview(png, out, 4)


def test_no_preview_of_a_dataset_that_fails(tmp_path, idx_dir, capsys):
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}", "--runner=DirectRunner"])
    shard = out / "mnist-test.tfrecord-00000-of-00001"
    shard.write_bytes(shard.read_bytes()[:-5])
    png = tmp_path / "preview.png"
    assert main([str(out), f"--preview={png}"]) == 2
    assert "bytes, manifest says" in capsys.readouterr().err
    assert not png.exists()


def test_unwritable_preview_is_one_line(tmp_path, idx_dir, capsys):
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}", "--runner=DirectRunner"])
    png = tmp_path / "missing-folder" / "preview.png"
    assert main([str(out), f"--preview={png}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {png}: cannot write the preview (No such file or directory)"]


def test_preview_count_must_be_positive(tmp_path, capsys):
    assert main([str(tmp_path), f"--preview={tmp_path}/p.png", "--preview_count=0"]) == 2
    assert capsys.readouterr().err == "error: --preview_count=0: must be >= 1\n"
