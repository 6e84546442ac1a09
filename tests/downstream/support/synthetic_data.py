"""A tiny anomaly-detection data set in anomalib's ``Folder`` layout: noise images, the anomalous ones with a bright
square, and the squares' masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

SIZE = 32
SQUARE = slice(8, 20)


def make_folder_dataset(root: Path, normal: int = 8, abnormal: int = 4, seed: int = 0) -> Path:
    """Write ``good/``, ``bad/`` and ``mask/`` PNG images under ``root``; return ``root``."""
    rng = np.random.default_rng(seed)
    for name in ("good", "bad", "mask"):
        (root / name).mkdir(parents=True, exist_ok=True)
    for index in range(normal):
        _noise(rng).save(root / "good" / f"{index:03d}.png")
    for index in range(abnormal):
        image = np.asarray(_noise(rng)).copy()
        image[SQUARE, SQUARE] = 255
        mask = np.zeros((SIZE, SIZE), dtype=np.uint8)
        mask[SQUARE, SQUARE] = 255
        Image.fromarray(image).save(root / "bad" / f"{index:03d}.png")
        Image.fromarray(mask).save(root / "mask" / f"{index:03d}.png")
    return root


def _noise(rng: np.random.Generator) -> Image.Image:
    return Image.fromarray((rng.random((SIZE, SIZE, 3)) * 60 + 100).astype(np.uint8))
