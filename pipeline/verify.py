"""``python -m pipeline.verify OUTPUT``: re-reads a written dataset end to end.

Checks, for every shard the manifest lists: the file exists, its size and
sha256 match, every record's CRCs are intact, every record decodes as an
Example of the contract, and the counts per shard and per split match. Each
split's ``index`` values must be exactly 0..N-1, so a lost or duplicated
example is caught even if the manifest was rewritten to match. Shard files
the manifest does not list are reported too. The first problem found ends the
run with one line naming the file, and exit status 2 (bad input). With
``--preview=FILE.png`` a verified dataset is also drawn: each split's first
examples in stored order and its label histogram, from the records themselves.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import re
import sys
import zlib
from typing import BinaryIO, Callable, Optional

import mnist_contract as contract
from mnist_common import console
from mnist_common.flags import OneLineParser, number
from mnist_common.stop import Stopped
from pipeline import credentials, faults, preview, stop, storage
from pipeline.errors import PipelineError

# Records are decoded by `mnist_contract.wire`, and local files read without
# Beam, so verifying a local dataset loads neither TensorFlow nor Beam.

DEFAULT_PREVIEW_COUNT = 10


class VerificationError(Exception):
    """A problem in the dataset: bad input."""

    exit_status = console.BAD_INPUT


def verify(output: str, on_record: Optional[Callable[[str, dict], None]] = None
           ) -> contract.Manifest:
    """Checks the dataset at ``output``; returns its manifest.

    ``on_record(split, values)`` is called with each decoded record, in
    stored order (shards in manifest order, records in file order).
    """
    if storage.is_remote(output):
        storage.use_anonymous_gcs_for_emulator()
    manifest_path = contract.join_path(output, contract.MANIFEST_FILE)
    journal = contract.join_path(output, contract.PUBLISH_JOURNAL_FILE)
    if storage.exists(journal):
        raise VerificationError(
            contract.interrupted_publish_message(journal, storage.read_bytes(journal)))
    if not storage.exists(manifest_path):
        raise VerificationError(f"{manifest_path}: missing (no complete dataset here)")
    try:
        manifest = contract.Manifest.from_json(
            storage.read_bytes(manifest_path), manifest_path)
    except contract.ContractError as e:
        raise VerificationError(str(e)) from None
    listed = set()
    for split_name, split in sorted(manifest.splits.items()):
        indices = []
        for shard in split.shards:
            path = contract.join_path(output, shard.file)
            listed.add(shard.file)
            seen = None if on_record is None else functools.partial(on_record, split_name)
            indices.extend(_verify_shard(path, shard, manifest, seen))
        if sorted(indices) != list(range(split.num_examples)):
            raise VerificationError(
                f"{manifest_path}: split {split_name!r} indices are not exactly "
                f"0..{split.num_examples - 1} (lost or duplicated examples)")
    for name in sorted(storage.top_level(output) - listed):
        try:
            contract.parse_shard_filename(name)
        except contract.ContractError:
            continue
        raise VerificationError(f"{contract.join_path(output, name)}: shard file not "
                                "listed in the manifest")
    return manifest


class _HashingReader:
    """Passes a stream's bytes on while counting and hashing them as stored."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.sha256.update(data)
        self.num_bytes += len(data)
        return data


def _verify_shard(path: str, shard: contract.ShardInfo, manifest: contract.Manifest,
                  on_record: Optional[Callable[[dict], None]]) -> list[int]:
    """Streams one shard: records decoded one by one, size and sha256 at the end."""
    from mnist_contract import framing, wire
    faults.point(f"verify:{shard.file}")
    if not storage.exists(path):
        raise VerificationError(f"{path}: listed in the manifest but missing")
    indices = []
    with storage.open_read(path) as stored:
        hashed = _HashingReader(stored)
        stream = (gzip.GzipFile(fileobj=hashed, mode="rb")
                  if manifest.compression == "gzip" else hashed)
        try:
            for record in framing.iter_records(stream, path):
                try:
                    values = wire.decode_example(record, manifest.image_format)
                except Exception as e:  # any decode failure is a bad record
                    raise VerificationError(
                        f"{path}: record {len(indices)} does not decode ({e})") from None
                indices.append(values[contract.INDEX_KEY])
                if on_record is not None:
                    on_record(values)
        except framing.FramingError as e:
            problem = _size_or_hash_problem(path, hashed, shard)
            raise VerificationError(problem or str(e)) from None
        except (EOFError, OSError, zlib.error) as e:
            problem = _size_or_hash_problem(path, hashed, shard)
            raise VerificationError(problem or f"{path}: corrupt gzip ({e})") from None
        problem = _size_or_hash_problem(path, hashed, shard)
    if problem:
        raise VerificationError(problem)
    if len(indices) != shard.num_examples:
        raise VerificationError(
            f"{path}: {len(indices)} records, manifest says {shard.num_examples}")
    return indices


def _size_or_hash_problem(path: str, hashed: _HashingReader,
                          shard: contract.ShardInfo) -> str:
    """Size and checksum against the manifest, once the whole file has been read."""
    while hashed.read(1 << 20):
        pass
    if hashed.num_bytes != shard.num_bytes:
        return f"{path}: {hashed.num_bytes} bytes, manifest says {shard.num_bytes}"
    if hashed.sha256.hexdigest() != shard.sha256:
        return f"{path}: sha256 does not match the manifest"
    return ""


def _help_text() -> str:
    """The module docstring as plain text: no reST markup, no usage line."""
    text = re.sub(r"``([^`]*)``", r"\1", __doc__).split(": ", 1)[1]
    return text[0].upper() + text[1:]


class _RefusedNumber(ValueError):
    """A number the parser refuses (``--preview_count=0: must be >= 1``),
    reported as the program's other bad input is."""


class _Parser(OneLineParser):
    number_error = _RefusedNumber


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m pipeline.verify", allow_abbrev=False,
        usage="%(prog)s OUTPUT [--preview=FILE.png [--preview_count=N]]",
        description=_help_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 verified, 1 a failure at run time, 2 bad arguments "
               "or a problem in the dataset (one line 'error: FILE: problem').")
    parser.add_argument("output", help="dataset folder or gs://bucket/prefix")
    parser.add_argument("--preview", metavar="FILE.png", default=None,
                        help="also draw each split's first examples and label "
                             "histogram into this local PNG file")
    parser.add_argument("--preview_count", metavar="N", type=number(int, min=1),
                        default=DEFAULT_PREVIEW_COUNT,
                        help="examples drawn per split (default: %(default)s)")
    return parser


def main(argv=None) -> int:
    """Verifies; SIGINT, SIGTERM and SIGHUP end it with one line, exit 128+N
    (`pipeline.stop`: nothing is left to clean up, the preview is written whole
    or not at all)."""
    with stop.handling_signals():
        try:
            return _main(argv)
        except Stopped as e:
            print(f"error: python -m pipeline.verify: interrupted ({e.name}) before "
                  "the dataset was verified", file=sys.stderr)
            return e.exit_status


def _main(argv) -> int:
    try:
        args = build_parser().parse_args(argv)
    except _RefusedNumber as e:
        print(f"error: {e}", file=sys.stderr)
        return console.BAD_INPUT
    collector = preview.PreviewCollector(args.preview_count) if args.preview else None
    try:
        credentials.require([args.output], None)
        manifest = verify(args.output, collector)
    except (PipelineError, VerificationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    except storage.NotAFile as e:  # a folder or FIFO where the dataset has a file
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return console.BAD_INPUT
    except OSError as e:  # the storage refuses or fails
        print(f"error: {e.filename or args.output}: cannot be read ({e.strerror or e})",
              file=sys.stderr)
        return console.FAILURE
    if collector is not None:
        try:
            preview.write(args.preview, preview.render(collector))
        except OSError as e:
            print(f"error: {args.preview}: cannot write the preview "
                  f"({e.strerror or e})", file=sys.stderr)
            return console.FAILURE
    for name, split in sorted(manifest.splits.items()):
        print(f"{name}: {split.num_examples} examples in {len(split.shards)} "
              f"shard(s) verified")
    if collector is not None:
        print(f"preview of the first {args.preview_count} examples of each split "
              f"-> {args.preview}")
    return console.OK


if __name__ == "__main__":
    sys.exit(main())
