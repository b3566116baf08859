"""The job writing straight into a bucket of a real local GCS API server."""

import hashlib
import io
import json
import uuid

import numpy as np
import pytest

import mnist_contract as contract
from mnist_contract import examples, framing


from pipeline.errors import PipelineInputError
from tests.helpers import EMULATOR_BUCKET, run_job


def bucket_files(client, prefix):
    return {b.name[len(prefix) + 1:]: b.download_as_bytes()
            for b in client.list_blobs(EMULATOR_BUCKET, prefix=prefix + "/")}


def test_job_writes_into_gcs_bucket(gcs_emulator, idx_dir, digits):
    prefix = f"datasets/{uuid.uuid4().hex[:8]}"
    output = f"gs://{EMULATOR_BUCKET}/{prefix}"
    manifest = run_job([f"--source={idx_dir}", f"--output={output}",
                        "--runner=DirectRunner", "--min_shards=2",
                        "--allow_extreme_sharding"])
    files = bucket_files(gcs_emulator.client(), prefix)
    assert set(files) == {"manifest.json", "dataset_info.json", "features.json",
                          *manifest.split("train").files, *manifest.split("test").files}
    stored = contract.Manifest.from_json(files["manifest.json"].decode())
    assert stored == manifest
    for split, (images, labels) in digits.items():
        seen = {}
        for shard in stored.split(split).shards:
            data = files[shard.file]
            assert hashlib.sha256(data).hexdigest() == shard.sha256
            for record in framing.iter_records(io.BytesIO(data), shard.file):
                values = examples.decode_example(record, "raw")
                image, label, index = (values[k] for k in contract.FEATURE_NAMES)
                assert index not in seen
                seen[index] = (image, label)
        assert sorted(seen) == list(range(len(labels)))
        np.testing.assert_array_equal(np.stack([seen[i][0] for i in sorted(seen)]), images)
        assert [seen[i][1] for i in sorted(seen)] == labels.tolist()
    assert json.loads(files["dataset_info.json"])["name"] == "mnist"

    with pytest.raises(PipelineInputError, match=f"{output}: already holds a dataset"):
        run_job([f"--source={idx_dir}", f"--output={output}", "--runner=DirectRunner"])
    assert bucket_files(gcs_emulator.client(), prefix) == files


def test_source_files_read_from_gcs(gcs_emulator, idx_dir, tmp_path, digits):
    prefix = f"raw/{uuid.uuid4().hex[:8]}"
    bucket = gcs_emulator.client().bucket(EMULATOR_BUCKET)
    for path in idx_dir.iterdir():
        bucket.blob(f"{prefix}/{path.name}").upload_from_filename(str(path))
    manifest = run_job([f"--source=gs://{EMULATOR_BUCKET}/{prefix}",
                        f"--output={tmp_path}/out", "--runner=DirectRunner"])
    assert manifest.split("train").num_examples == len(digits["train"][1])
