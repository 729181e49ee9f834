"""Loader for the MNIST handwritten digits, with verified download."""

import contextlib
import gzip
import hashlib
import http.client
import math
import os
import shutil
import tempfile
import urllib.request
import zlib

import numpy as np
from sklearn.utils import Bunch

from ._data_home import resolve_data_home

__all__ = ["load_mnist"]

# Tried in order; each must serve the four files under their official
# ``*.gz`` names. The original site is last because it often refuses
# automated downloads.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)

_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# sha256 of the *decompressed* IDX content. Mirrors re-compress the files
# with different gzip settings and headers, so digests of the ``.gz`` files
# would differ from mirror to mirror although the data are identical.
_SHA256 = {
    "train-images-idx3-ubyte": (
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"
    ),
    "train-labels-idx1-ubyte": (
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"
    ),
    "t10k-images-idx3-ubyte": (
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"
    ),
    "t10k-labels-idx1-ubyte": (
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"
    ),
}

_ENV_VAR = "SKASSOC_MNIST_DIR"
_TIMEOUT = 60  # seconds, per connection attempt and per blocking read
_CHUNK_SIZE = 1 << 20

# IDX type codes (third byte of the magic number); multi-byte values are
# stored big-endian.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"

_DESCR = """\
MNIST handwritten digits
------------------------

Grey-scale 28x28 images of the digits 0-9 (pixel values 0-255) with their
labels: 60000 training and 10000 test images. The training set has
between 5421 (digit 5) and 6742 (digit 1) images per class.

Y. LeCun, L. Bottou, Y. Bengio and P. Haffner, "Gradient-based learning
applied to document recognition", Proceedings of the IEEE, 86(11),
2278-2324, 1998.
"""


def _resolve_data_home(data_home):
    return resolve_data_home(data_home, _ENV_VAR, "mnist")


def _is_gzip(path):
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def _open_maybe_gzip(path):
    # Sniff the content rather than trusting the suffix: some tools
    # decompress files without renaming them, and vice versa.
    if _is_gzip(path):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _read_exactly(f, n, path):
    data = f.read(n)
    if len(data) != n:
        raise ValueError(
            f"{path!r} is not a valid IDX file: it ends inside the header."
        )
    return data


def _read_idx(path):
    """Read an IDX file, gzip-compressed or not, into a numpy array.

    Parameters
    ----------
    path : str or path-like
        The file to read.

    Returns
    -------
    array : ndarray
        Array of the shape and type given by the file header, in native
        byte order.

    Raises
    ------
    ValueError
        If the header is malformed or the amount of data does not match the
        dimensions stated in the header.
    """
    path = os.fspath(path)
    try:
        compressed = _is_gzip(path)
        with _open_maybe_gzip(path) as f:
            magic = _read_exactly(f, 4, path)
            if magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_DTYPES:
                raise ValueError(
                    f"{path!r} is not a valid IDX file: bad magic number "
                    f"0x{magic.hex()} (expected 0x0000TTNN with a known type "
                    "code TT and NN dimensions)."
                )
            dtype = _IDX_DTYPES[magic[2]]
            ndim = magic[3]
            shape = tuple(
                int(d) for d in np.frombuffer(_read_exactly(f, 4 * ndim, path), ">u4")
            )
            # Check the announced size before allocating, so that a damaged
            # header gives a clear error instead of a MemoryError. Deflate
            # cannot compress better than about 1032:1.
            nbytes = math.prod(shape) * dtype.itemsize
            max_nbytes = os.path.getsize(path) * (1032 if compressed else 1)
            if nbytes > max_nbytes:
                raise ValueError(
                    f"{path!r} is not a valid IDX file: its header announces "
                    f"shape {shape} ({nbytes} bytes of data), more than the "
                    "file can hold."
                )
            array = np.empty(shape, dtype=dtype)
            # Filling the array chunk by chunk avoids holding the whole
            # decompressed content twice in memory.
            buffer = memoryview(array.reshape(-1).view(np.uint8))
            n_read = 0
            while n_read < array.nbytes:
                n = f.readinto(buffer[n_read : n_read + _CHUNK_SIZE])
                if not n:
                    break
                n_read += n
            trailing = f.read(1)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"{path!r} is not a valid gzip file: {exc}") from exc
    if n_read != array.nbytes or trailing:
        raise ValueError(
            f"{path!r} is not a valid IDX file: its header announces shape "
            f"{shape} ({array.nbytes} bytes of data) but the file holds "
            f"{'more' if trailing else n_read} bytes of data."
        )
    return array.astype(dtype.newbyteorder("="), copy=False)


def _sha256_of_content(path):
    """sha256 hex digest of the file, decompressed first if it is gzipped."""
    digest = hashlib.sha256()
    with _open_maybe_gzip(path) as f:
        for chunk in iter(lambda: f.read(_CHUNK_SIZE), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _find_file(folder, name):
    """Path of ``name`` or ``name.gz`` in ``folder``, or None."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    return None


def _missing_message(name, folder, download_tried=False):
    message = (
        f"MNIST file {name!r} (or {name + '.gz'!r}) was not found in "
        f"{folder!r}. Put the file there, or point `data_home` or the "
        f"{_ENV_VAR} environment variable to the folder that holds the "
        "MNIST files"
    )
    if download_tried:
        return message + "."
    return (
        message + ", or call load_mnist with download_if_missing=True to download them."
    )


def _missing_parents(folder):
    """The folders ``os.makedirs(folder)`` would create, deepest first."""
    missing = []
    folder = os.path.abspath(folder)
    while not os.path.exists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


def _download(name, folder):
    """Download ``name`` from the first mirror that serves it correctly.

    The file is written to a temporary file in ``folder`` and renamed only
    once its content has been verified, so an interrupted or corrupted
    download never shows up under the final name.
    """
    created = _missing_parents(folder)
    os.makedirs(folder, exist_ok=True)
    try:
        return _download_from_mirrors(name, folder)
    except OSError:
        # Leave no empty folders behind a failed download.
        for path in created:
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise


def _download_from_mirrors(name, folder):
    expected = _SHA256[name]
    failures = []
    mismatch = None
    for mirror in MNIST_MIRRORS:
        url = mirror + name + ".gz"
        fd, tmp_path = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
        try:
            try:
                with (
                    os.fdopen(fd, "wb") as out,
                    urllib.request.urlopen(url, timeout=_TIMEOUT) as response,
                ):
                    shutil.copyfileobj(response, out, _CHUNK_SIZE)
            except (OSError, http.client.HTTPException) as exc:
                # OSError covers URLError, HTTPError (e.g. 404) and timeouts;
                # HTTPException covers a connection cut in mid-transfer.
                failures.append(f"{url}: {exc}")
                continue
            try:
                actual = _sha256_of_content(tmp_path)
            except (OSError, EOFError, zlib.error) as exc:
                actual = f"unreadable content ({exc})"
            if actual != expected:
                # Another mirror may still have an intact copy.
                mismatch = (url, actual)
                failures.append(f"{url}: checksum mismatch")
                continue
            # mkstemp creates files readable by their owner only; a data
            # folder is often shared.
            os.chmod(tmp_path, 0o644)
            # Keep the name honest about the encoding of what was served.
            final = os.path.join(folder, name + (".gz" if _is_gzip(tmp_path) else ""))
            os.replace(tmp_path, final)
            return final
        finally:
            if os.path.exists(tmp_path):
                os.remove(tmp_path)

    tried = "\n  ".join(failures)
    if mismatch is not None:
        url, actual = mismatch
        raise OSError(
            f"Checksum mismatch for MNIST file {name!r} downloaded from {url}: "
            f"expected sha256 {expected} of the decompressed content, got "
            f"{actual}. The download was discarded; retry later, or download "
            f"the file yourself into {folder!r} (and delete any damaged copy "
            f"there). Mirrors tried:\n  {tried}"
        )
    raise FileNotFoundError(
        f"{_missing_message(name, folder, download_tried=True)} Downloading "
        f"failed from every mirror:\n  {tried}"
    )


def load_mnist(
    subset="train", *, data_home=None, download_if_missing=True, return_X_y=False
):
    """Load the MNIST handwritten digits data set.

    =================   ==============
    Classes                         10
    Samples total                70000
    Samples (train)              60000
    Samples (test)               10000
    Image shape               28 x 28
    Pixel values         integer 0-255
    =================   ==============

    The four standard IDX files (``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and
    ``t10k-labels-idx1-ubyte``) are read from a folder, each either
    gzip-compressed (with a ``.gz`` suffix) or not.

    Parameters
    ----------
    subset : {"train", "test"}, default="train"
        Which part of the data set to load.

    data_home : str or path-like, default=None
        Folder that directly holds the MNIST files. If None, the
        ``SKASSOC_MNIST_DIR`` environment variable is used if set, else
        ``os.path.join(sklearn.datasets.get_data_home(), "mnist")``.

    download_if_missing : bool, default=True
        If True, files that are missing from the folder are downloaded from
        the first of ``skassoc.datasets._mnist.MNIST_MIRRORS`` that serves
        them, and stored in the folder as ``*.gz`` files. Each download is
        verified against the sha256 digest of the official decompressed
        content before it is kept.

    return_X_y : bool, default=False
        If True, return ``(data, target)`` instead of a Bunch.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        Dictionary-like object with the following attributes.

        data : ndarray of shape (n_samples, 28, 28), dtype=uint8
            The images.
        target : ndarray of shape (n_samples,), dtype=int64
            The digit shown by each image, 0-9.
        DESCR : str
            Description of the data set.
        data_home : str
            The folder the files were read from.

    (data, target) : tuple if ``return_X_y`` is True
        The two arrays described above.

    Raises
    ------
    FileNotFoundError
        If a file is missing and ``download_if_missing`` is False, or if no
        mirror could provide it (the error lists why each one failed).
        ``FileNotFoundError`` is a subclass of ``OSError``.
    OSError
        If no mirror provided a file whose decompressed content matches the
        expected sha256 digest, and at least one provided a file that does
        not match (the error names the file and both digests). Damaged
        downloads are deleted, never kept.
    ValueError
        If ``subset`` is unknown or a file is not a valid MNIST IDX file.

    Examples
    --------
    >>> from skassoc.datasets import load_mnist
    >>> X, y = load_mnist("test", return_X_y=True)  # doctest: +SKIP
    >>> X.shape, X.dtype, y.shape  # doctest: +SKIP
    ((10000, 28, 28), dtype('uint8'), (10000,))
    """
    if subset not in _FILES:
        raise ValueError(
            f"subset must be one of {sorted(_FILES)}, got {subset!r} instead."
        )
    folder = _resolve_data_home(data_home)

    arrays = []
    for name in _FILES[subset]:
        path = _find_file(folder, name)
        if path is None:
            if not download_if_missing:
                raise FileNotFoundError(_missing_message(name, folder))
            path = _download(name, folder)
        arrays.append((path, _read_idx(path)))
    (images_path, images), (labels_path, labels) = arrays

    if images.ndim != 3 or images.shape[1:] != (28, 28) or images.dtype != np.uint8:
        raise ValueError(
            f"{images_path!r} does not hold MNIST images: expected uint8 data "
            f"of shape (n_samples, 28, 28), got {images.dtype} data of shape "
            f"{images.shape}."
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise ValueError(
            f"{labels_path!r} does not hold MNIST labels: expected uint8 data "
            f"of shape (n_samples,), got {labels.dtype} data of shape "
            f"{labels.shape}."
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{images_path!r} holds {images.shape[0]} images but "
            f"{labels_path!r} holds {labels.shape[0]} labels."
        )
    if labels.size and labels.max() > 9:
        raise ValueError(
            f"{labels_path!r} does not hold MNIST labels: expected digits 0-9, "
            f"got {int(labels.max())}; the file may be corrupted."
        )
    target = labels.astype(np.int64)

    if return_X_y:
        return images, target
    return Bunch(data=images, target=target, DESCR=_DESCR, data_home=folder)
