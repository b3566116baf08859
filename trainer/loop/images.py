"""The pictures the trainer shows in TensorBoard, drawn with numpy alone.

Grids of digits, digits captioned ``P<predicted> T<true>`` and the confusion
matrix with its counts. Labels use a 3x5 pixel font, so the trainer needs no
imaging library. Pure functions of arrays (`trainer.loop.summaries` writes
them).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

GRID_COLUMNS = 8

# 3x5 glyphs, one string per row ("#": ink).
_FONT = {
    "0": ("###", "#.#", "#.#", "#.#", "###"), "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"), "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"), "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"), "7": ("###", "..#", "..#", "..#", "..#"),
    "8": ("###", "#.#", "###", "#.#", "###"), "9": ("###", "#.#", "###", "..#", "###"),
    "P": ("###", "#.#", "###", "#..", "#.."), "T": ("###", ".#.", ".#.", ".#.", ".#."),
}
_SCALE = 2  # font and digit pixels per image pixel in the labelled images
_GAP = 2
_BACKGROUND = (40, 40, 40)
_PREDICTED_INK, _TRUE_INK = (255, 110, 110), (120, 230, 120)


def text_mask(text: str, scale: int = _SCALE) -> np.ndarray:
    """bool [5*scale, (4*len-1)*scale]: ``text`` in the 3x5 font, one column between glyphs."""
    rows = [np.array([[c == "#" for c in row] for row in _FONT[ch]]) for ch in text]
    spaced = [np.pad(glyph, ((0, 0), (0, 1))) for glyph in rows]
    mask = np.concatenate(spaced, axis=1)[:, :-1] if spaced else np.zeros((5, 0), bool)
    return mask.repeat(scale, axis=0).repeat(scale, axis=1)


def _stamp(canvas: np.ndarray, mask: np.ndarray, top: int, left: int, ink) -> None:
    """Paints ``mask`` onto ``canvas`` (RGB, in place) at (top, left) in ``ink``."""
    region = canvas[top:top + mask.shape[0], left:left + mask.shape[1]]
    region[mask] = ink


def to_rgb(images: np.ndarray, scale: int = 1) -> np.ndarray:
    """uint8 RGB [N, H*scale, W*scale, 3] from float [N, H, W, 1] images in [0, 1]."""
    gray = np.clip(np.rint(np.asarray(images, np.float32)[..., 0] * 255), 0, 255)
    gray = gray.astype(np.uint8).repeat(scale, axis=1).repeat(scale, axis=2)
    return np.repeat(gray[..., None], 3, axis=-1)


def image_grid(tiles: np.ndarray, columns: int = GRID_COLUMNS) -> np.ndarray:
    """uint8 [H, W, 3]: RGB ``tiles`` [N, h, w, 3] in rows of ``columns``, ``_GAP`` apart."""
    n, h, w = tiles.shape[:3]
    columns = max(1, min(columns, n))
    rows = max(1, -(-n // columns))
    grid = np.empty((rows * (h + _GAP) + _GAP, columns * (w + _GAP) + _GAP, 3), np.uint8)
    grid[:] = _BACKGROUND
    for i, tile in enumerate(tiles):
        top, left = _GAP + (i // columns) * (h + _GAP), _GAP + (i % columns) * (w + _GAP)
        grid[top:top + h, left:left + w] = tile
    return grid


def captioned(images: np.ndarray, predicted: Sequence[int],
              labels: Sequence[int]) -> np.ndarray:
    """RGB tiles: each digit ``_SCALE`` times its size over ``P<predicted> T<true>``."""
    digits = to_rgb(images, _SCALE)
    n, h, w = digits.shape[:3]
    strip = 5 * _SCALE + 2 * _GAP
    tiles = np.zeros((n, h + strip, w, 3), np.uint8)
    tiles[:, :h] = digits
    for tile, p, t in zip(tiles, predicted, labels):
        _stamp(tile, text_mask(f"P{p}"), h + _GAP, 0, _PREDICTED_INK)
        _stamp(tile, text_mask(f"T{t}"), h + _GAP, w // 2, _TRUE_INK)
    return tiles


def confusion_image(matrix: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3]: the count matrix, a class label before each row and
    above each column; cells shaded by their share of the row."""
    k = matrix.shape[0]
    char = 4 * _SCALE
    width = (len(str(max(int(matrix.max()), 0))) + 1) * char
    height = 5 * _SCALE + char  # the text, half a character above and below
    image = np.zeros(((k + 1) * height, (k + 1) * width, 3), np.uint8)
    image[:] = _BACKGROUND
    totals = np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    shade = np.rint(255 * matrix / totals).astype(np.uint8)
    text_top, text_left = (height - 5 * _SCALE) // 2, char // 2
    for c in range(k):
        label = text_mask(str(c))
        _stamp(image, label, (c + 1) * height + text_top, text_left, _TRUE_INK)
        _stamp(image, label, text_top, (c + 1) * width + text_left, _PREDICTED_INK)
    for (row, col), count in np.ndenumerate(matrix):
        top, left = (row + 1) * height, (col + 1) * width
        image[top + 1:top + height - 1, left + 1:left + width - 1] = shade[row, col]
        ink = (0, 0, 0) if shade[row, col] > 127 else (255, 255, 255)
        _stamp(image, text_mask(str(count)), top + text_top, left + text_left, ink)
    return image
