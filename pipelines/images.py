"""Image-folder source: a directory of still images played as a video at a fixed rate.

`list_images` and `read_image` are the one reader of image folders (a benchmark's extracted frames
use them too, `hermes.datasets.record_frames`).

docs/ARCHITECTURE.md, Sources. Files are ordered by natural filename order (``frame2.png`` before ``frame10.png``),
frame ``i`` gets ``t_s = i / fps``. Only jpg/jpeg/png/bmp/webp files count; other files (a
README, ``.DS_Store``) are ignored. An empty folder fails on open; an image that cannot be
decoded fails when it is reached, naming the file.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Iterator

import cv2

from hermes.errors import SourceError, UsageError
from hermes.pipelines.frames import Frame, FrameSource
from hermes.redact import redact_url

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")

_DIGITS_RE = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders embedded numbers by value: ``img2`` < ``img10``.

    Args:
        name: a file name.

    Returns:
        A tuple alternating text and integer parts (comparable between any two names, since
        ``re.split`` with a capturing group always starts with text), then the name itself as
        a tie-break (``img01`` vs ``img1``).
    """
    parts = _DIGITS_RE.split(name.lower())
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def list_images(folder: Path) -> list[Path]:
    """The image files directly inside `folder`, in natural order.

    Args:
        folder: the directory to list.

    Returns:
        Paths of regular files with an image extension (case-insensitive), hidden files skipped.
    """
    files = [p for p in folder.iterdir()
             if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() and not p.name.startswith(".")]
    return sorted(files, key=lambda p: natural_key(p.name))


def read_image(path: Path):
    """One image file as an upright RGB array (H, W, 3) uint8.

    Raises:
        SourceError: the file cannot be decoded (naming it, and why where that is known).
    """
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise SourceError(f"cannot read image {redact_url(path)}: {_unreadable_reason(path)}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _unreadable_reason(path: Path) -> str:
    """Why `cv2.imread` returned nothing, as the second half of a one-line message."""
    if path.suffix.lower() == ".png" and "decord" in sys.modules:
        # decord's wheel bundles zlib 1.2.3; imported before cv2, its zlib serves OpenCV's libpng,
        # which then rejects every PNG ("libpng error: bad parameters to zlib").
        return ("OpenCV cannot decode PNG in this process because decord (which bundles an old "
                "zlib) was imported before cv2; import cv2 before decord")
    return f"not a valid {path.suffix.lstrip('.').lower()} file; replace or remove it"


class ImageFolderSource(FrameSource):
    """A folder of images as a non-live source at `fps` frames per second."""

    live = False

    def __init__(self, folder: str | Path, *, fps: float = 1.0) -> None:
        """List the folder (images are decoded lazily, one per frame).

        Args:
            folder: the directory holding the images.
            fps: frames per second of the sequence: image ``i`` has ``t_s = i / fps``.

        Raises:
            SourceError: the folder does not exist or holds no image files.
            UsageError: `fps` is not positive.
        """
        super().__init__()
        if not fps or fps <= 0:
            raise UsageError(f"fps of an image folder must be positive, got {fps}")
        self.folder = Path(folder)
        self.fps = float(fps)
        if not self.folder.is_dir():
            raise SourceError(f"image folder not found: {redact_url(self.folder)}")
        self.files = list_images(self.folder)
        if not self.files:
            exts = "/".join(e.lstrip(".") for e in IMAGE_EXTENSIONS)
            raise SourceError(
                f"image folder {redact_url(self.folder)} holds no images: expected {exts} files"
            )
        self._closed = False
        log.info("opened %s", self.describe())

    def __len__(self) -> int:
        return len(self.files)

    @property
    def duration_s(self) -> float:
        """Length of the sequence in seconds (``len / fps``)."""
        return len(self.files) / self.fps

    def __iter__(self) -> Iterator[Frame]:
        """Yield every image in order, decoded to RGB.

        Raises:
            SourceError: an image cannot be decoded (the message names the file).
        """
        for index, path in enumerate(self.files):
            if self._closed:
                return
            rgb = read_image(path)
            self._stats.frames_read += 1
            self._stats.frames_sampled += 1
            self._stats.frames_taken += 1
            yield Frame(index / self.fps, rgb, index)

    def close(self) -> None:
        """Stop iteration at the next frame; nothing else is held open."""
        self._closed = True

    def describe(self) -> str:
        return (f"image folder {redact_url(self.folder)} ({len(self.files)} images at "
                f"{self.fps:g} fps)")
