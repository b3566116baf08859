"""Where the conversion job's CPU goes: py-spy samples sorted into the job's stages.

``py-spy record --threads --subprocesses -f raw`` writes one line per
distinct stack (``frame;frame;... count``, root first, each frame
``function (file:line)``), counting only samples of threads on a CPU. Each
stack is charged to one stage, decided by its innermost frame that names
one (`stage_of_frame`); a frame of the job's own code is judged by the text
of its source line, so a line that hashes or writes is charged to that work
whichever function it is in.

Stages, in the order the benchmark prints them:

    read       gunzip and decode the IDX files
    encode     build the serialized Examples
    shuffle    shuffle keys, sorting, spill files and their merge
    write      TFRecord framing and every file write
    hash       crc32c and sha256
    beam       Beam, the interpreter's imports and the runner; what no
               stage above claims
"""

from __future__ import annotations

import collections
import linecache
import re
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parent.parent

STAGES = ("read", "encode", "shuffle", "write", "hash", "beam")
STAGE_TITLES = {"read": "read and decode the IDX", "encode": "encode the Examples",
                "shuffle": "key and shuffle", "write": "write and frame",
                "hash": "hash (crc32c, sha256)", "beam": "Beam, imports and runner"}

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")
_READ_FILES = ("gzip.py", "_compression.py", "pipeline/source/")
_ENCODE = ("mnist_contract/wire.py", "encode_examples")
_SHUFFLE = ("pipeline/shard/batches.py", "pipeline/shard/shard_io.py",
            "pipeline/shard/sharding.py")
_WRITE = ("mnist_contract/framing.py", "pipeline/storage.py")


def _line_text(file: str, line: int) -> str:
    """The source line a frame names, if the file is the job's own code."""
    path = REPO / file
    return linecache.getline(str(path), line) if path.is_file() else ""


def stage_of_frame(frame: str) -> Optional[str]:
    """The stage one py-spy frame names, or None if it names none.

    The job's own lines are judged by their text first: a line calling
    crc32c or sha256 is ``hash``, one writing a file is ``write``.
    """
    match = _FRAME.match(frame)
    if not match:
        return None
    function, file = match["function"], match["file"]
    if any(part in file for part in _READ_FILES):
        return "read"
    text = _line_text(file, int(match["line"]))
    if "crc32c" in text or "sha256" in text:
        return "hash"
    if re.search(r"\.write\(|write_bytes\(", text):
        return "write"
    if any(part in file or part in function for part in _ENCODE):
        return "encode"
    if any(part in file for part in _WRITE) or "ShardFileWriter" in function:
        return "write"
    if any(part in file for part in _SHUFFLE):
        return "shuffle"
    return None


def stage_of_stack(frames: list[str]) -> str:
    """The stage of one sampled stack (root first): its innermost frame that names one."""
    for frame in reversed(frames):
        stage = stage_of_frame(frame)
        if stage:
            return stage
    return "beam"


def stage_samples(raw_lines: Iterable[str]) -> dict[str, int]:
    """{stage: samples} of a py-spy raw profile, every stage present."""
    counts = collections.Counter({stage: 0 for stage in STAGES})
    for line in raw_lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack, count = line.rsplit(" ", 1)
        counts[stage_of_stack(stack.split(";"))] += int(count)
    return dict(counts)


def stage_seconds(samples: dict[str, int], cpu_seconds: float) -> dict[str, float]:
    """Each stage's share of the samples, as seconds of ``cpu_seconds``."""
    total = sum(samples.values())
    return {stage: cpu_seconds * n / total if total else 0.0 for stage, n in samples.items()}
