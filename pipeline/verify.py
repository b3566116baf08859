"""``python -m pipeline.verify OUTPUT``: re-reads a written dataset end to end.

Checks, for every shard the manifest lists: the file exists, its size and
sha256 match, every record's CRCs are intact, every record decodes as an
Example of the contract, and the counts per shard and per split match. Each
split's ``index`` values must be exactly 0..N-1, so a lost or duplicated
example is caught even if the manifest was rewritten to match. Shard files
the manifest does not list are reported too. The first problem found ends the
run with one line naming the file, and exit status 1.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
import zlib

from pipeline import contract, records, storage


class VerificationError(Exception):
    pass


def verify(output: str) -> contract.Manifest:
    storage.use_anonymous_gcs_for_emulator()
    manifest_path = contract.join_path(output, contract.MANIFEST_FILE)
    if not storage.exists(manifest_path):
        raise VerificationError(f"{manifest_path}: missing (no complete dataset here)")
    try:
        manifest = contract.Manifest.from_json(
            storage.read_bytes(manifest_path).decode(), manifest_path)
    except contract.ContractError as e:
        raise VerificationError(str(e)) from None
    listed = set()
    for split_name, split in sorted(manifest.splits.items()):
        indices = []
        for shard in split.shards:
            path = contract.join_path(output, shard.file)
            listed.add(shard.file)
            indices.extend(_verify_shard(path, shard, manifest))
        if sorted(indices) != list(range(split.num_examples)):
            raise VerificationError(
                f"{manifest_path}: split {split_name!r} indices are not exactly "
                f"0..{split.num_examples - 1} (lost or duplicated examples)")
    prefix = output.rstrip("/") + "/"
    for path in storage.list_dir(output):
        name = path[len(prefix):]
        if "/" not in name and name not in listed:
            try:
                contract.parse_shard_filename(name)
            except contract.ContractError:
                continue
            raise VerificationError(f"{path}: shard file not listed in the manifest")
    return manifest


def _verify_shard(path: str, shard: contract.ShardInfo,
                  manifest: contract.Manifest) -> list[int]:
    if not storage.exists(path):
        raise VerificationError(f"{path}: listed in the manifest but missing")
    data = storage.read_bytes(path)
    if len(data) != shard.num_bytes:
        raise VerificationError(
            f"{path}: {len(data)} bytes, manifest says {shard.num_bytes}")
    if hashlib.sha256(data).hexdigest() != shard.sha256:
        raise VerificationError(f"{path}: sha256 does not match the manifest")
    if manifest.compression == "gzip":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:
            raise VerificationError(f"{path}: corrupt gzip ({e})") from None
    indices = []
    try:
        for record in records.iter_framed_records(data, path):
            try:
                _, label, index = records.decode_example(record, manifest.image_format)
            except Exception as e:  # any decode failure is a bad record
                raise VerificationError(
                    f"{path}: record {len(indices)} does not decode ({e})") from None
            if not 0 <= label < contract.NUM_CLASSES:
                raise VerificationError(f"{path}: record {len(indices)} has label {label}")
            indices.append(index)
    except ValueError as e:
        raise VerificationError(str(e)) from None
    if len(indices) != shard.num_examples:
        raise VerificationError(
            f"{path}: {len(indices)} records, manifest says {shard.num_examples}")
    return indices


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.verify",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("output", help="dataset folder or gs:// prefix")
    args = parser.parse_args(argv)
    try:
        manifest = verify(args.output)
    except VerificationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, split in sorted(manifest.splits.items()):
        print(f"{name}: {split.num_examples} examples in {len(split.shards)} "
              f"shard(s) verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
