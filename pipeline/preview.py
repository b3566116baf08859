"""``python -m pipeline.verify OUTPUT --preview=FILE.png``: what the records hold, as a picture.

For each split (in `mnist_contract.SPLITS` order) one section: a title line,
a grid of its first N examples in stored order (shard 0 first, records in
file order), each drawn from the record's own pixels scaled by `SCALE` and
captioned with its label and index, then a bar per digit of the split's
label histogram, counted over every record. So a wrong label, a broken
shuffle or a damaged image shows at a glance. Pillow only (its default font
writes the captions); the records come to `PreviewCollector` from
``pipeline.verify``, which decodes each one anyway.
"""

from __future__ import annotations

import dataclasses
import io
import os

import numpy as np

import mnist_contract as contract
from mnist_common import local_paths

SCALE = 3  # each pixel of a digit becomes SCALE x SCALE pixels
COLUMNS = 10  # cells per grid row; the histogram has one bar per column
MARGIN = 8
GAP = 6  # between cells, and between a section's parts
TEXT = 14  # height of a line of text
BARS = 60  # height of the tallest histogram bar
CELL = contract.IMAGE_WIDTH * SCALE
PITCH = CELL + GAP  # from one column to the next
BACKGROUND, INK, BAR = 255, 0, 128  # grayscale values


@dataclasses.dataclass
class SplitPreview:
    """One split as the preview shows it: the first examples and every label's count."""

    images: list = dataclasses.field(default_factory=list)
    labels: list = dataclasses.field(default_factory=list)
    indices: list = dataclasses.field(default_factory=list)
    counts: list = dataclasses.field(default_factory=lambda: [0] * contract.NUM_CLASSES)


class PreviewCollector:
    """Called with each decoded record in stored order; keeps what the preview draws."""

    def __init__(self, count: int):
        self.count = count
        self.splits: dict[str, SplitPreview] = {}

    def __call__(self, split: str, values: dict) -> None:
        seen = self.splits.setdefault(split, SplitPreview())
        label = values[contract.LABEL_KEY]
        seen.counts[label] += 1
        if len(seen.images) < self.count:
            seen.images.append(np.array(values[contract.IMAGE_KEY], np.uint8))
            seen.labels.append(label)
            seen.indices.append(values[contract.INDEX_KEY])


def grid_rows(count: int) -> int:
    return max(1, -(-count // COLUMNS))


def section_height(count: int) -> int:
    """A split's title, grid (cell plus caption per row) and histogram (bars, digits)."""
    return TEXT + grid_rows(count) * (CELL + TEXT + GAP) + TEXT + BARS + TEXT + GAP


def size(num_splits: int, count: int) -> tuple[int, int]:
    """(width, height) of the preview of ``num_splits`` splits of ``count`` examples each."""
    return (2 * MARGIN + COLUMNS * PITCH - GAP,
            2 * MARGIN + num_splits * section_height(count))


def cell_origin(section: int, k: int, count: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of example ``k``'s image in section ``section``."""
    top = MARGIN + section * section_height(count) + TEXT
    return (MARGIN + (k % COLUMNS) * PITCH, top + (k // COLUMNS) * (CELL + TEXT + GAP))


def render(collector: PreviewCollector) -> bytes:
    """The preview as PNG bytes: one section per split the collector saw."""
    from PIL import Image, ImageDraw, ImageFont
    names = [s for s in contract.SPLITS if s in collector.splits]
    canvas = Image.new("L", size(len(names), collector.count), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default()
    for section, name in enumerate(names):
        _draw_section(canvas, draw, font, section, name, collector)
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG")
    return buffer.getvalue()


def _draw_section(canvas, draw, font, section: int, name: str,
                  collector: PreviewCollector) -> None:
    from PIL import Image
    seen, count = collector.splits[name], collector.count
    top = MARGIN + section * section_height(count)
    total = sum(seen.counts)
    draw.text((MARGIN, top), f"{name}: {total:,} examples; the first {len(seen.images)} "
              "in stored order, then the label histogram", fill=INK, font=font)
    for k, (image, label, index) in enumerate(zip(seen.images, seen.labels, seen.indices)):
        x, y = cell_origin(section, k, count)
        scaled = np.repeat(np.repeat(image, SCALE, axis=0), SCALE, axis=1)
        canvas.paste(Image.fromarray(scaled, mode="L"), (x, y))
        draw.text((x, y + CELL + 1), f"{label}  #{index}", fill=INK, font=font)
    base = top + TEXT + grid_rows(count) * (CELL + TEXT + GAP) + TEXT + BARS
    most = max(seen.counts) or 1
    for digit, n in enumerate(seen.counts):
        x = MARGIN + digit * PITCH
        height = round(BARS * n / most)
        if height:
            draw.rectangle((x, base - height, x + CELL - 1, base - 1), fill=BAR)
        draw.text((x, base - height - TEXT), f"{n:,}", fill=INK, font=font)
        draw.text((x, base + 1), f"digit {digit}", fill=INK, font=font)


def write(path: str, data: bytes) -> None:
    """Writes the PNG whole or not at all: a hidden file beside it, then renamed."""
    folder, name = os.path.split(os.path.abspath(path))
    temp = os.path.join(folder, f".{name}.partial-{os.getpid()}")
    try:
        with open(temp, "wb") as f:
            f.write(data)
        local_paths.move(temp, path, overwrite=True)
    except BaseException:
        if os.path.lexists(temp):
            local_paths.remove_file(temp)
        raise
