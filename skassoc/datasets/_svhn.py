"""Loader for the Street View House Numbers (SVHN) digits."""

import os

import numpy as np
from scipy.io import loadmat
from scipy.io.matlab import MatReadError
from sklearn.utils import Bunch

from ._data_home import resolve_data_home

__all__ = ["load_svhn"]

_FILES = {
    "train": "train_32x32.mat",
    "test": "test_32x32.mat",
    "extra": "extra_32x32.mat",
}

_ENV_VAR = "SKASSOC_SVHN_DIR"
_URL = "http://ufldl.stanford.edu/housenumbers/"

_DESCR = """\
SVHN (Street View House Numbers), cropped digits ("format 2")
------------------------------------------------------------

32x32 RGB images of house-number digits cropped from Google Street View
pictures, each centred on one digit 0-9: 73257 training, 26032 test and
531131 "extra" (somewhat less difficult) images.

Y. Netzer, T. Wang, A. Coates, A. Bissacco, B. Wu and A. Y. Ng, "Reading
Digits in Natural Images with Unsupervised Feature Learning", NIPS Workshop
on Deep Learning and Unsupervised Feature Learning, 2011.
http://ufldl.stanford.edu/housenumbers/
"""


def _resolve_data_home(data_home):
    return resolve_data_home(data_home, _ENV_VAR, "svhn")


def _read_mat(path, subset):
    """Read the arrays 'X' and 'y' of an SVHN ``.mat`` file.

    Raises a ValueError that names the file and says what to do where scipy
    cannot read it (a MATLAB v7.3 file, a truncated or foreign one) or it
    lacks either variable.
    """
    try:
        mat = loadmat(path, variable_names=["X", "y"])
    except NotImplementedError as exc:
        # scipy's way of refusing MATLAB v7.3 files, which are HDF5 files.
        if "7.3" not in str(exc):
            raise
        raise ValueError(
            f"{path!r} is a MATLAB v7.3 file (an HDF5 file), which "
            "scipy.io.loadmat cannot read. The official SVHN files are MATLAB "
            f"v5 files: download {_FILES[subset]!r} again from {_URL}, or "
            "convert this one (in MATLAB: load it, then save(path, 'X', 'y', "
            "'-v7')). h5py can read it as it is, with every array's axes in "
            "reverse order."
        ) from exc
    except (MatReadError, OSError, ValueError, TypeError) as exc:
        # scipy's errors for truncated or foreign files do not name the file.
        raise ValueError(
            f"{path!r} is not a readable MATLAB file ({type(exc).__name__}: "
            f"{exc}); it may be truncated or corrupted: download it again from "
            f"{_URL}."
        ) from exc
    if "X" not in mat or "y" not in mat:
        raise ValueError(
            f"{path!r} does not hold SVHN data: expected variables 'X' and "
            f"'y', found {sorted(k for k in mat if not k.startswith('__'))}."
        )
    return mat["X"], mat["y"]


def load_svhn(subset="train", *, data_home=None, return_X_y=False):
    """Load the SVHN cropped-digits data set ("format 2").

    =================   ==============
    Classes                         10
    Samples (train)              73257
    Samples (test)               26032
    Samples (extra)             531131
    Image shape            3 x 32 x 32
    Pixel values         integer 0-255
    =================   ==============

    The files (``train_32x32.mat``, ``test_32x32.mat`` and
    ``extra_32x32.mat``) are not downloaded by this function because they
    are large (the extra set alone is over 1 GB); get them from
    http://ufldl.stanford.edu/housenumbers/ and put them in one folder.

    Parameters
    ----------
    subset : {"train", "test", "extra"}, default="train"
        Which part of the data set to load.

    data_home : str or path-like, default=None
        Folder that directly holds the SVHN ``.mat`` files. If None, the
        ``SKASSOC_SVHN_DIR`` environment variable is used if set, else
        ``os.path.join(sklearn.datasets.get_data_home(), "svhn")``.

    return_X_y : bool, default=False
        If True, return ``(data, target)`` instead of a Bunch.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        Dictionary-like object with the following attributes.

        data : ndarray of shape (n_samples, 3, 32, 32), dtype=uint8
            The RGB images, channels first: ``data[i, c, h, w]`` is
            ``X[h, w, c, i]`` of the ``.mat`` file.
        target : ndarray of shape (n_samples,), dtype=int64
            The digit shown by each image, 0-9. The files encode the digit 0
            as label 10; it is mapped to 0 here.
        DESCR : str
            Description of the data set.
        data_home : str
            The folder the file was read from.

    (data, target) : tuple if ``return_X_y`` is True
        The two arrays described above.

    Raises
    ------
    FileNotFoundError
        If the file for ``subset`` is not in the folder.
    ValueError
        If ``subset`` is unknown, the file is not a MATLAB v5 file (v7.3
        files are HDF5, which scipy cannot read), or it does not hold SVHN
        images and labels of the expected shapes and values.

    Examples
    --------
    >>> from skassoc.datasets import load_svhn
    >>> X, y = load_svhn("test", return_X_y=True)  # doctest: +SKIP
    >>> X.shape, X.dtype, y.shape  # doctest: +SKIP
    ((26032, 3, 32, 32), dtype('uint8'), (26032,))
    """
    if subset not in _FILES:
        raise ValueError(
            f"subset must be one of {sorted(_FILES)}, got {subset!r} instead."
        )
    folder = _resolve_data_home(data_home)
    path = os.path.join(folder, _FILES[subset])
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"SVHN file {_FILES[subset]!r} was not found in {folder!r}. "
            f"It is not downloaded automatically because of its size: get it "
            f"from {_URL} (the cropped digits, format 2), then put it in "
            f"that folder, or point `data_home` or the {_ENV_VAR} "
            "environment variable to the folder that holds it."
        )

    X, y = _read_mat(path, subset)
    if X.ndim != 4 or X.shape[:3] != (32, 32, 3) or X.dtype != np.uint8:
        raise ValueError(
            f"{path!r} does not hold SVHN images: expected 'X' to be uint8 of "
            f"shape (32, 32, 3, n_samples), got {X.dtype} of shape {X.shape}."
        )
    n_samples = X.shape[3]
    # The official files store 'y' as a column; a row or 1-D vector (as
    # scipy.io.savemat writes by default) holds the same labels.
    if y.size != n_samples or np.squeeze(y).ndim > 1:
        raise ValueError(
            f"{path!r} does not hold SVHN labels: expected 'y' of shape "
            f"({n_samples}, 1) to match 'X', got shape {y.shape}."
        )
    y = y.ravel()
    bad = ~np.isin(y, np.arange(1, 11))
    if bad.any():
        raise ValueError(
            f"{path!r} does not hold SVHN labels: expected integer labels "
            f"1-10 in 'y', got {bad.sum()} other value(s), e.g. "
            f"{y[bad][:3].tolist()}."
        )

    target = y.astype(np.int64) % 10
    # Channels-first is what convolutional networks in torch expect; the copy
    # makes the result C-contiguous so that batches are cheap to slice.
    data = np.ascontiguousarray(X.transpose(3, 2, 0, 1))
    if return_X_y:
        return data, target
    return Bunch(data=data, target=target, DESCR=_DESCR, data_home=folder)
