"""A picture of one digit, as people draw or photograph it, made into MNIST's form.

MNIST's digits are white on black, 28x28: each was fitted into a 20x20 box
keeping its aspect ratio, then placed so that its centre of mass is the
image's centre. A model trained on them misreads a digit drawn black on
white, or one that fills its canvas, so `to_mnist` makes any picture that
form first: grayscale, the background found (from the border) and made
black, the digit cropped, scaled into the 20x20 box and centred by mass.
`is_mnist_form` tells a picture that is already in that form, which is taken
as it is.

Only numpy: decoding the file is the caller's (`trainer.predict`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

SIZE = 28  # MNIST's image side
BOX = 20   # the side of the box each MNIST digit was fitted into
# Below this difference between digit and background (of 255) there is no digit to find.
MIN_CONTRAST = 32.0


class NoDigit(ValueError):
    """The picture is blank: nothing stands out from its background."""


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The 28x28x1 uint8 image (white digit on black) and what was done, in words."""

    image: np.ndarray
    note: str


def grayscale(pixels: np.ndarray) -> np.ndarray:
    """float32 [H,W] in 0..255 from [H,W] or [H,W,C] (C: gray, gray+alpha, RGB, RGBA).

    Colour is weighed as luma (ITU-R BT.601); transparent parts are laid on
    white, as a drawing program shows them.
    """
    scale = 255.0 / np.iinfo(pixels.dtype).max if pixels.dtype.kind == "u" else 1.0
    image = pixels.astype(np.float32) * np.float32(scale)
    if image.ndim == 2:
        return image
    channels = image.shape[-1]
    alpha = image[..., -1] / 255.0 if channels in (2, 4) else None
    colour = image[..., :3] if channels >= 3 else image[..., :1]
    gray = (colour @ np.array([0.299, 0.587, 0.114], np.float32) if colour.shape[-1] == 3
            else colour[..., 0])
    return gray if alpha is None else gray * alpha + 255.0 * (1.0 - alpha)


def border(gray: np.ndarray) -> np.ndarray:
    """The pixels of a band along the four edges (1/20 of the shorter side, at least 1)."""
    band = max(1, min(gray.shape) // 20)
    return np.concatenate([gray[:band].ravel(), gray[-band:].ravel(),
                           gray[:, :band].ravel(), gray[:, -band:].ravel()])


def is_mnist_form(pixels: np.ndarray) -> bool:
    """A 28x28 single-channel 8-bit picture on a dark background: MNIST's own form."""
    return (pixels.dtype == np.uint8 and pixels.shape[:2] == (SIZE, SIZE)
            and (pixels.ndim == 2 or pixels.shape[2] == 1)
            and float(np.median(border(pixels.reshape(SIZE, SIZE)))) <= 127.0)


def to_mnist(pixels: np.ndarray) -> Prepared:
    """`Prepared` for any picture of one digit; `NoDigit` for a blank one."""
    gray = grayscale(pixels)
    inverted = float(np.median(border(gray))) > 127.0
    if inverted:  # a dark digit on a light background: MNIST's digits are light on dark
        gray = 255.0 - gray
    ink, box = _ink(gray)
    top, bottom, left, right = box
    digit = _fit(ink[top:bottom, left:right], BOX)
    image = _centre_by_mass(digit, SIZE)
    steps = ["grayscale"] if pixels.ndim == 3 and pixels.shape[2] > 1 else []
    steps.append("inverted (dark digit on a light background)" if inverted
                 else "background made black")
    steps.append(f"cropped to {bottom - top}x{right - left}, scaled to "
                 f"{digit.shape[0]}x{digit.shape[1]} and centred by mass in {SIZE}x{SIZE}")
    return Prepared(image[..., None], ", ".join(steps))


def _ink(gray: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """How much ink each pixel holds (0..1, background 0) and the digit's box
    ``(top, bottom, left, right)``.

    The background is a plane fitted to the border (`_background`), so light
    that falls across a photo is not taken for ink. The digit is what a
    threshold (Otsu's) separates from it on a 3x3-smoothed copy, which keeps
    sensor or paper noise out; the box spans the ink but for the outermost
    0.2% of its mass on each side (and with the ink adjoining it), so a
    speck far away does not stretch it.
    """
    above = gray - _background(gray)
    smooth = _smooth(above)
    if float(smooth.max()) < MIN_CONTRAST:
        raise NoDigit("no digit found: nothing stands out from the background")
    threshold = max(_otsu(np.clip(smooth, 0.0, 255.0)), MIN_CONTRAST / 2)
    full = float(np.percentile(above[smooth > threshold], 99.9))
    ink = np.clip(above / max(full, 1.0), 0.0, 1.0)
    ink[smooth <= min(_noise_floor(smooth), threshold / 2)] = 0.0
    rows, cols = _span(ink.sum(axis=1)), _span(ink.sum(axis=0))
    return ink, (rows[0], rows[1], cols[0], cols[1])


def _noise_floor(smooth: np.ndarray) -> float:
    """The level below which a pixel is background noise: 6 standard
    deviations of the border's (robustly, from its median absolute deviation)."""
    edge = border(smooth)
    spread = 1.4826 * float(np.median(np.abs(edge - np.median(edge))))
    return max(1.0, 6.0 * spread)


def _background(gray: np.ndarray) -> np.ndarray:
    """The background's level at each pixel: a plane fitted to the border's
    pixels, fitted again without those far from it (a stroke that touches
    the edge)."""
    height, width = gray.shape
    band = max(1, min(gray.shape) // 20)
    edge = np.zeros(gray.shape, bool)
    edge[:band], edge[-band:], edge[:, :band], edge[:, -band:] = True, True, True, True
    rows, cols = np.nonzero(edge)
    design = np.stack([np.ones(len(rows)), rows, cols], axis=1).astype(np.float64)
    values = gray[edge].astype(np.float64)
    keep = np.ones(len(values), bool)
    for _ in range(2):
        coef = np.linalg.lstsq(design[keep], values[keep], rcond=None)[0]
        residual = np.abs(values - design @ coef)
        keep = residual <= 3.0 * float(np.median(residual)) + 1.0
    base, per_row, per_col = (np.float32(c) for c in coef)
    return (base + per_row * np.arange(height, dtype=np.float32)[:, None]
            + per_col * np.arange(width, dtype=np.float32)[None, :])


def _smooth(gray: np.ndarray) -> np.ndarray:
    """The 3x3 mean of each pixel (edges repeated)."""
    padded = np.pad(gray, 1, mode="edge")
    height, width = gray.shape
    return sum(padded[i:i + height, j:j + width] for i in range(3) for j in range(3)) / 9.0


def _otsu(gray: np.ndarray) -> float:
    """The level that best splits ``gray``'s histogram in two (Otsu's method)."""
    counts, edges = np.histogram(gray, bins=256, range=(0.0, 256.0))
    levels = (edges[:-1] + edges[1:]) / 2
    weight = np.cumsum(counts).astype(np.float64)
    mass = np.cumsum(counts * levels)
    total, total_mass = weight[-1], mass[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_low = mass / weight
        mean_high = (total_mass - mass) / (total - weight)
        between = weight * (total - weight) * (mean_low - mean_high) ** 2
    return float(edges[int(np.nanargmax(between)) + 1])


def _span(profile: np.ndarray) -> tuple[int, int]:
    """``[first, last + 1)`` of a mass profile less 0.2% of the mass at each
    end, then widened over the ink that adjoins it (a faint edge of the digit,
    not a speck apart from it)."""
    cumulative = np.cumsum(profile, dtype=np.float64)
    total = cumulative[-1]
    first = int(np.searchsorted(cumulative, 0.002 * total, side="right"))
    last = int(np.searchsorted(cumulative, 0.998 * total, side="left"))
    while first > 0 and profile[first - 1] > 0:
        first -= 1
    while last + 1 < len(profile) and profile[last + 1] > 0:
        last += 1
    return first, max(last + 1, first + 1)


def _fit(ink: np.ndarray, box: int) -> np.ndarray:
    """``ink`` scaled so its longer side is ``box``, aspect ratio kept, each
    output pixel the mean of the area it covers (as an anti-aliased scaling)."""
    height, width = ink.shape
    scale = box / max(height, width)
    out_h, out_w = max(1, round(height * scale)), max(1, round(width * scale))
    return _area_weights(out_h, height) @ ink @ _area_weights(out_w, width).T


def _area_weights(out: int, size: int) -> np.ndarray:
    """[out, size]: row i averages the input span that output pixel i covers."""
    edges = np.linspace(0.0, size, out + 1)
    starts, ends = edges[:-1, None], edges[1:, None]
    pixel = np.arange(size)[None, :]
    overlap = np.clip(np.minimum(ends, pixel + 1) - np.maximum(starts, pixel), 0.0, None)
    return overlap / overlap.sum(axis=1, keepdims=True)


def _centre_by_mass(digit: np.ndarray, size: int) -> np.ndarray:
    """uint8 [size,size]: ``digit`` (0..1) at full range, its centre of mass at the centre."""
    digit = digit / max(float(digit.max()), 1e-6)
    height, width = digit.shape
    total = float(digit.sum())
    centre_row = float((digit.sum(axis=1) * np.arange(height)).sum()) / total
    centre_col = float((digit.sum(axis=0) * np.arange(width)).sum()) / total
    middle = size / 2  # where MNIST put the centre of mass (pixel 14 of 0..27)
    top = int(np.clip(round(middle - centre_row), 0, size - height))
    left = int(np.clip(round(middle - centre_col), 0, size - width))
    image = np.zeros((size, size), np.float32)
    image[top:top + height, left:left + width] = digit
    return np.round(image * 255.0).astype(np.uint8)
