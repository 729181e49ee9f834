"""Loader for the STL-10 image recognition data set (binary format)."""

import os

import numpy as np
from sklearn.utils import Bunch

from ._data_home import resolve_data_home

__all__ = ["load_stl10"]

#: Files of every subset: (images, labels); the unlabeled subset has no labels.
_FILES = {
    "train": ("train_X.bin", "train_y.bin"),
    "test": ("test_X.bin", "test_y.bin"),
    "unlabeled": ("unlabeled_X.bin", None),
}

_SUBFOLDER = "stl10_binary"
_CLASS_NAMES_FILE = "class_names.txt"
_ENV_VAR = "SKASSOC_STL10_DIR"
_URL = "https://cs.stanford.edu/~acoates/stl10/"

_IMAGE_SHAPE = (3, 96, 96)
_IMAGE_BYTES = 3 * 96 * 96
_N_CLASSES = 10

#: The class names of the official ``class_names.txt``, labels 1-10 in order.
_CLASS_NAMES = (
    "airplane",
    "bird",
    "car",
    "cat",
    "deer",
    "dog",
    "horse",
    "monkey",
    "ship",
    "truck",
)

_DESCR = """\
STL-10 (binary version)
-----------------------

96x96 RGB images of 10 classes (airplane, bird, car, cat, deer, dog, horse,
monkey, ship, truck) taken from ImageNet: 5000 labeled training images (500
per class), 8000 labeled test images (800 per class) and 100000 unlabeled
images, which also hold animals and vehicles of other classes.

A. Coates, H. Lee and A. Y. Ng, "An Analysis of Single Layer Networks in
Unsupervised Feature Learning", AISTATS, 2011.
https://cs.stanford.edu/~acoates/stl10/
"""


def _resolve_data_home(data_home):
    return resolve_data_home(data_home, _ENV_VAR, "stl10")


def _find_folder(folder, names):
    """The folder that holds the files ``names``: ``folder`` or its subfolder.

    The archive extracts to ``stl10_binary/``; both that folder and the one
    that contains it are accepted. Raises FileNotFoundError naming the first
    missing file when neither holds them all.
    """
    candidates = [folder, os.path.join(folder, _SUBFOLDER)]
    for candidate in candidates:
        if all(os.path.isfile(os.path.join(candidate, name)) for name in names):
            return candidate
    # Name the file missing from the folder that holds most of them.
    best = max(
        candidates,
        key=lambda c: sum(os.path.isfile(os.path.join(c, n)) for n in names),
    )
    missing = next(n for n in names if not os.path.isfile(os.path.join(best, n)))
    raise FileNotFoundError(
        f"STL-10 file {missing!r} was not found in {folder!r} nor in its "
        f"{_SUBFOLDER!r} subfolder. It is not downloaded automatically because "
        f"of its size (several GB): get stl10_binary.tar.gz from {_URL}, "
        "extract it there (it creates the 'stl10_binary' folder), or point "
        f"`data_home` or the {_ENV_VAR} environment variable to the folder "
        "that holds the .bin files."
    )


def _n_images(path):
    """Number of images in an STL-10 image file, from its size."""
    size = os.path.getsize(path)
    if size == 0 or size % _IMAGE_BYTES:
        raise ValueError(
            f"{path!r} does not hold STL-10 images: its size ({size} bytes) is "
            f"not a positive multiple of 3*96*96 = {_IMAGE_BYTES} bytes, the "
            "size of one image. The file is probably truncated or of another "
            f"format; download the binary version again from {_URL}."
        )
    return size // _IMAGE_BYTES


def _read_images(path, mmap):
    """Images as (n, 3, 96, 96) uint8, channels first and rows before columns.

    The file stores every channel column-major (a column after the other),
    so the array of shape (n, 3, 96, 96) read from it is indexed
    ``[image, channel, column, row]``; swapping the last two axes gives
    ``[image, channel, row, column]``.
    """
    n_images = _n_images(path)
    if mmap:
        raw = np.memmap(path, dtype=np.uint8, mode="r", shape=(n_images, *_IMAGE_SHAPE))
        return raw.swapaxes(2, 3)
    raw = np.fromfile(path, dtype=np.uint8).reshape(n_images, *_IMAGE_SHAPE)
    # The copy makes the result C-contiguous so that batches are cheap to slice.
    return np.ascontiguousarray(raw.swapaxes(2, 3))


def _read_labels(path, n_images, images_path):
    labels = np.fromfile(path, dtype=np.uint8)
    if labels.size != n_images:
        raise ValueError(
            f"{images_path!r} holds {n_images} images but {path!r} holds "
            f"{labels.size} labels; one of the two files is truncated or "
            f"belongs to another subset. Download them again from {_URL}."
        )
    if labels.size and (labels.min() < 1 or labels.max() > _N_CLASSES):
        raise ValueError(
            f"{path!r} does not hold STL-10 labels: expected values 1-10, got "
            f"values from {labels.min()} to {labels.max()}. Download the "
            f"binary version again from {_URL}."
        )
    return labels.astype(np.int64) - 1


def _read_class_names(folder):
    """Class names from ``class_names.txt``, else the official ones."""
    path = os.path.join(folder, _CLASS_NAMES_FILE)
    if not os.path.isfile(path):
        return list(_CLASS_NAMES)
    with open(path, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    if len(names) != _N_CLASSES:
        raise ValueError(
            f"{path!r} does not hold the STL-10 class names: expected "
            f"{_N_CLASSES} non-empty lines, got {len(names)}. Restore it from "
            f"the archive at {_URL}, or delete it to use the official names."
        )
    return names


def load_stl10(subset="train", *, data_home=None, return_X_y=False, mmap="auto"):
    """Load the STL-10 data set (binary version).

    ===================  ==============
    Classes              10
    Samples (train)      5000
    Samples (test)       8000
    Samples (unlabeled)  100000
    Image shape          3 x 96 x 96
    Pixel values         integer 0-255
    ===================  ==============

    The files are not downloaded by this function because they are large
    (the unlabeled images alone take 2.7 GB): get
    ``stl10_binary.tar.gz`` from https://cs.stanford.edu/~acoates/stl10/ and
    extract it. The folder read is ``data_home`` itself if it holds the
    files, else its ``stl10_binary`` subfolder (where the archive puts them).

    Parameters
    ----------
    subset : {"train", "test", "unlabeled"}, default="train"
        Which part of the data set to load: ``train_X.bin`` and
        ``train_y.bin``, ``test_X.bin`` and ``test_y.bin``, or
        ``unlabeled_X.bin``.

    data_home : str or path-like, default=None
        Folder that holds the STL-10 ``.bin`` files, or their
        ``stl10_binary`` folder. If None, the ``SKASSOC_STL10_DIR``
        environment variable is used if set, else
        ``os.path.join(sklearn.datasets.get_data_home(), "stl10")``.

    return_X_y : bool, default=False
        If True, return ``(data, target)`` instead of a Bunch.

    mmap : "auto" or bool, default="auto"
        If True, the images are not read into memory: ``data`` is a read-only
        view of a :class:`numpy.memmap` of the image file, whose pages the
        operating system reads when they are used (and can drop again).
        Indexing it with an array, as in ``data[indices]``, copies the
        selected images into memory; writing to it raises an error. If False,
        the images are read into an ordinary C-contiguous array. ``"auto"``
        memory-maps the 2.7 GB ``"unlabeled"`` subset only.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        Dictionary-like object with the following attributes.

        data : ndarray of shape (n_samples, 3, 96, 96), dtype=uint8
            The RGB images, channels first: ``data[i, c, h, w]`` is the pixel
            at row ``h`` and column ``w`` of channel ``c`` of image ``i``.
            The file stores every channel column by column; the memory-mapped
            array is therefore a view with swapped last axes, not
            C-contiguous.
        target : ndarray of shape (n_samples,), dtype=int64
            The class of each image, 0-9 (the files' labels 1-10 minus one);
            all -1 (unlabeled) for the ``"unlabeled"`` subset.
        target_names : list of str
            The name of each class, read from ``class_names.txt`` when the
            folder holds it, else the official names (``"airplane"``,
            ``"bird"``, ..., ``"truck"``).
        DESCR : str
            Description of the data set.
        data_home : str
            The folder the files were read from.

    (data, target) : tuple if ``return_X_y`` is True
        The two arrays described above.

    Raises
    ------
    FileNotFoundError
        If a file of ``subset`` is in neither the folder nor its
        ``stl10_binary`` subfolder.
    ValueError
        If ``subset`` or ``mmap`` is unknown, if the size of the image file
        is not a multiple of 3*96*96 bytes, if the number of labels does not
        match the number of images, if a label is not in 1-10, or if
        ``class_names.txt`` does not hold 10 names.

    Examples
    --------
    >>> from skassoc.datasets import load_stl10
    >>> X, y = load_stl10("test", return_X_y=True)  # doctest: +SKIP
    >>> X.shape, X.dtype, y.shape  # doctest: +SKIP
    ((8000, 3, 96, 96), dtype('uint8'), (8000,))
    >>> X_unlabeled = load_stl10("unlabeled").data  # doctest: +SKIP
    >>> type(X_unlabeled).__name__, X_unlabeled.flags.writeable  # doctest: +SKIP
    ('memmap', False)
    """
    if subset not in _FILES:
        raise ValueError(
            f"subset must be one of {sorted(_FILES)}, got {subset!r} instead."
        )
    if isinstance(mmap, str) and mmap == "auto":
        mmap = subset == "unlabeled"
    elif not isinstance(mmap, (bool, np.bool_)):
        raise ValueError(f"mmap must be 'auto', True or False, got {mmap!r} instead.")

    images_name, labels_name = _FILES[subset]
    folder = _find_folder(
        _resolve_data_home(data_home), [n for n in (images_name, labels_name) if n]
    )
    images_path = os.path.join(folder, images_name)
    target_names = _read_class_names(folder)
    data = _read_images(images_path, mmap)
    if labels_name is None:
        target = np.full(len(data), -1, dtype=np.int64)
    else:
        labels_path = os.path.join(folder, labels_name)
        target = _read_labels(labels_path, len(data), images_path)

    if return_X_y:
        return data, target
    return Bunch(
        data=data,
        target=target,
        target_names=target_names,
        DESCR=_DESCR,
        data_home=folder,
    )
