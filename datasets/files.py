"""Reading files of a data folder: directory listings, images (PIL) and LEAF JSON shards.

Shared by a node's own data (`datasets.local`) and the built-in LEAF data sets (`datasets.sources`);
it imports neither. Errors are `LocalDataError`s naming the file and what is allowed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
EXPORT_FILE = "bouquet-export.json"  # written by datasets.export; not data


class LocalDataError(ValueError):
    """A node's data cannot be used as declared; the message names the file and what is allowed."""


def visible(path: Path) -> list[Path]:
    """The entries of a folder, sorted, without hidden (`.`) and private (`_`) ones."""
    return sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))


def files(path: Path, suffix: str) -> list[Path]:
    """The visible files of a folder with `suffix` (the export's own record aside)."""
    return [p for p in visible(path) if p.is_file() and p.suffix.lower() == suffix
            and p.name != EXPORT_FILE]


def read_image(path: Path, input_shape: tuple[int, ...], dataset: str) -> np.ndarray:
    """One image as float32 [C, H, W] in [0, 1], converted to C channels (1 or 3) and resized to
    H×W (`input_shape`, as the run's data set `dataset` declares it)."""
    from PIL import Image, UnidentifiedImageError

    channels, height, width = (tuple(input_shape) + (0, 0, 0))[:3]
    if len(input_shape) != 3 or channels not in (1, 3):
        raise LocalDataError(f"{path}: images need a run input shape [1 or 3, H, W]; dataset "
                             f"'{dataset}' declares {list(input_shape)}")
    try:
        with Image.open(path) as image:
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (width, height):
                image = image.resize((width, height), Image.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise LocalDataError(f"{path}: not a readable image ({err}); allowed: image files "
                             f"({', '.join(IMAGE_SUFFIXES)}) that PIL can open") from None
    array = array[None] if channels == 1 else array.transpose(2, 0, 1)
    return array.astype(np.float32) / np.float32(255.0)


def read_json(path: Path) -> dict[str, Any]:
    """One LEAF JSON shard (keys users, num_samples, user_data)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as err:
        raise LocalDataError(f"{path}: not readable JSON ({err}); allowed: LEAF JSON with keys "
                             "users, num_samples, user_data") from None
    if not isinstance(data, dict) or not {"users", "user_data"} <= set(data):
        raise LocalDataError(f"{path}: not LEAF JSON; allowed: an object with keys users, "
                             "num_samples, user_data")
    return data


def leaf_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(train files, test files) of a LEAF folder; test files empty when the split is made locally."""
    if (folder / "train").is_dir():
        return files(folder / "train", ".json"), (
            files(folder / "test", ".json") if (folder / "test").is_dir() else [])
    return files(folder, ".json"), []
