"""Checks and conversions of user inputs: samples, image shapes, labels, device."""

import inspect
import math
import numbers
import os
import warnings

import numpy as np
import torch
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    check_array,
    check_consistent_length,
    column_or_1d,
    validate_data,
)

__all__ = [
    "UNLABELED",
    "as_tensor",
    "split_sample_shape",
    "to_model_layout",
    "encode_semi_supervised_labels",
    "unlabeled_mask",
    "check_label_types",
    "resolve_device",
    "check_sample_shape",
    "validate_memory_map",
]

#: The label that marks an unlabeled sample (scikit-learn's convention).
UNLABELED = -1


def is_integer(value):
    """Whether ``value`` is an integer (NumPy's included) and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(
        value, (bool, np.bool_)
    )


def split_sample_shape(X):
    """Flatten samples of any rank to rows; return the rows and one sample's shape.

    scikit-learn's validation works on 2-D rows, so image batches of shape
    ``(n, h, w)`` or ``(n, c, h, w)`` are validated as ``(n, h*w*c)`` rows and
    reshaped again afterwards. Other inputs (lists, DataFrames) are returned
    as they are, with ``None`` for the shape.
    """
    if isinstance(X, (list, tuple)):
        # A nested list of images: read its shape as NumPy would. Ragged or
        # otherwise odd lists go on as they are, for scikit-learn's message.
        try:
            array = np.asarray(X)
        except ValueError:
            array = None
        if array is not None and array.ndim > 2:
            X = array
    if hasattr(X, "ndim") and hasattr(X, "reshape") and X.ndim > 2:
        if X.ndim > 4:
            raise ValueError(
                f"X has {X.ndim} dimensions; expected 2-D rows, (n, h, w) "
                "grey images or (n, c, h, w) images."
            )
        X = np.asarray(X)
        # Not reshape(n, -1): NumPy cannot infer -1 for an empty batch, and
        # the empty batch must reach validation to get a useful message.
        return X.reshape(X.shape[0], math.prod(X.shape[1:])), tuple(X.shape[1:])
    return X, None


def validate_memory_map(estimator, X, y):
    """scikit-learn's checks of ``fit(X, y)`` for a memory-mapped ``X``.

    ``validate_data`` would flatten ``X`` to rows (a copy of a view that is
    not contiguous, such as :func:`~skassoc.datasets.load_stl10`'s) and
    converts float64 to float32 (another copy). Here the dtype and the
    number of features are checked on the first sample, and float inputs are
    scanned for NaN, infinity and values beyond float32 a few MiB at a time,
    so ``X`` stays on disk; integer inputs are not read at all.

    Returns
    -------
    y : ndarray of shape (n_samples,)
        The validated labels.
    """
    if not 2 <= X.ndim <= 4:
        raise ValueError(
            f"X has {X.ndim} dimensions; expected 2-D rows, (n, h, w) grey "
            "images or (n, c, h, w) images."
        )
    if X.dtype.kind not in "biuf":
        raise ValueError(
            f"X is a memory map of dtype {X.dtype}; store numbers (uint8 or "
            "float32, ideally) to train on it."
        )
    if any(step < 0 for step in X.strides):
        raise ValueError(
            "X is a reversed view of a memory map (negative strides, e.g. "
            "X[::-1]), which cannot be read in place: pass the map itself (and "
            "reorder y to match), or np.ascontiguousarray(X) to load it into "
            "memory."
        )
    # Sets n_features_in_ and checks what one sample can tell.
    first = np.asarray(X[:1]).reshape(min(len(X), 1), math.prod(X.shape[1:]))
    validate_data(estimator, first, dtype=None)
    if y is None:
        raise ValueError(
            f"{type(estimator).__name__} requires y to be passed, but the target "
            "y is None."
        )
    y = column_or_1d(y, warn=True)
    check_consistent_length(X, y)
    # The same finiteness check as validate_data's for y.
    y = check_array(y, ensure_2d=False, dtype=None, input_name="y")
    if X.dtype.kind == "f":
        _check_finite_in_chunks(X)
    return y


def _check_finite_in_chunks(X):
    limit = np.finfo(np.float32).max
    rows_per_chunk = max(1, 2**22 // max(1, X.itemsize * math.prod(X.shape[1:])))
    for start in range(0, len(X), rows_per_chunk):
        chunk = np.asarray(X[start : start + rows_per_chunk])
        if not np.isfinite(chunk).all():
            raise ValueError(
                "Input X contains NaN or infinity (memory-mapped X, rows "
                f"{start} to {start + len(chunk) - 1})."
            )
        if X.itemsize > 4 and (np.abs(chunk) > limit).any():
            raise ValueError(
                "X holds values too large for float32 (beyond +-3.4e38), the "
                "precision the network computes in; rescale X."
            )


def resolve_image_shape(sample_shape, input_shape, n_features):
    """The ``(channels, height, width)`` of one image, or None for feature rows.

    Parameters
    ----------
    sample_shape : tuple of int or None
        Shape of one sample as passed (None for 2-D rows).
    input_shape : tuple of int or None
        The estimator's ``input_shape`` parameter.
    n_features : int
        Number of values per sample.
    """
    if input_shape is not None:
        integers = all(is_integer(v) for v in input_shape)
        shape = tuple(int(v) for v in input_shape) if integers else ()
        if len(shape) == 2:
            shape = (1, *shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(
                f"input_shape must be (height, width) or (channels, height, "
                f"width) of positive sizes; got {input_shape!r}."
            )
        if math.prod(shape) != n_features:
            raise ValueError(
                f"input_shape={tuple(input_shape)} holds {math.prod(shape)} values "
                f"but each sample of X has {n_features}; pass the shape of one "
                "image, or leave input_shape=None for feature vectors."
            )
        if sample_shape is not None and _as_chw(sample_shape) != shape:
            raise ValueError(
                f"X holds images of shape {tuple(sample_shape)} but "
                f"input_shape={tuple(input_shape)}; leave input_shape=None for "
                "image batches (their shape is read from X), or pass X as 2-D "
                "rows."
            )
        return shape
    if sample_shape is None:
        return None
    return _as_chw(sample_shape)


def _as_chw(sample_shape):
    """``(h, w)`` -> ``(1, h, w)``; ``(c, h, w)`` as it is."""
    if len(sample_shape) == 2:
        return (1, *(int(v) for v in sample_shape))
    return tuple(int(v) for v in sample_shape)


def check_sample_shape(sample_shape, image_shape, n_features):
    """Check that samples passed at inference have the layout seen in ``fit``.

    Parameters
    ----------
    sample_shape : tuple of int or None
        Shape of one sample as passed (None for 2-D rows, which are always
        accepted; their width is checked by scikit-learn's validation).
    image_shape : tuple of int or None
        The fitted ``(channels, height, width)``, or None for feature rows.
    n_features : int
        Number of values in one sample seen in ``fit``.

    Raises
    ------
    ValueError
        If images of another shape than the fitted one are passed (e.g.
        ``(n, 4, 16)`` to a model of 8x8 images), or images to a model fitted
        on feature rows.
    """
    if sample_shape is None:
        return
    if image_shape is None:
        raise ValueError(
            f"X holds samples of shape {tuple(sample_shape)}, but the model was "
            f"fitted on feature rows of {n_features} features; pass X as 2-D "
            "rows (n_samples, n_features)."
        )
    if _as_chw(sample_shape) != tuple(image_shape):
        c, h, w = image_shape
        grey = f", (n, {h}, {w})" if c == 1 else ""
        raise ValueError(
            f"X holds images of shape {tuple(sample_shape)}, but the model was "
            f"fitted on images of shape (channels, height, width) = "
            f"{tuple(image_shape)}; pass X as (n, {c}, {h}, {w}){grey} or as "
            f"2-D rows of {c * h * w} values."
        )


def as_tensor(array):
    """A torch view of a NumPy array, read-only arrays included.

    torch warns on read-only arrays (memory maps, ``np.frombuffer``) because
    writing through the tensor would be undefined; skassoc never writes into
    its inputs, so the view is safe and spares a copy.
    """
    if isinstance(array, np.ndarray) and any(step < 0 for step in array.strides):
        # torch cannot view reversed arrays (X[::-1], np.flip): copy those.
        array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.as_tensor(array)


def to_model_layout(rows, image_shape):
    """Reshape validated rows to what the network takes, in its storage dtype.

    uint8 pixels stay uint8 (a quarter of the memory, on the host and on the
    GPU; networks convert per batch); everything else becomes float32.
    """
    if rows.dtype != np.uint8:
        wider = rows.dtype.kind == "f" and rows.dtype.itemsize > 4
        with np.errstate(over="ignore"):
            rows = rows.astype(np.float32, copy=False)
        # Finite float64 values beyond float32's range would become inf and
        # NaN losses or NaN probabilities; say so instead.
        if wider and not np.isfinite(rows).all():
            raise ValueError(
                "X holds values too large for float32 (beyond +-3.4e38), the "
                "precision the network computes in; rescale X."
            )
    if image_shape is None:
        return rows
    return rows.reshape(rows.shape[0], *image_shape)


def check_label_types(labels):
    """Refuse labels that mix strings and numbers (they cannot be sorted).

    Raises
    ------
    ValueError
        If ``labels`` (of a class each, the ``-1`` markers left out) holds
        strings next to other values.
    """
    labels = np.asarray(labels)
    if labels.dtype.kind != "O":
        return
    strings = np.array([isinstance(v, str) for v in labels])
    if strings.any() and not strings.all():
        kinds = sorted({type(v).__name__ for v in labels})
        raise ValueError(
            "The labels of y must be all strings or all numbers (besides the "
            f"-1 of unlabeled samples); got a mix of {', '.join(kinds)}. "
            "Convert them to one type, e.g. y.astype(str)."
        )


def unlabeled_mask(y):
    """Where ``y`` (an ndarray) holds the unlabeled marker ``-1``."""
    # A string array cannot hold the integer -1, so there the string "-1"
    # marks unlabeled samples (np.where(known, y, "-1") builds one). Object
    # arrays (pandas strings and categoricals arrive as such) accept both.
    if y.dtype.kind == "U":
        unlabeled = y == str(UNLABELED)
    elif y.dtype.kind == "S":
        unlabeled = y == str(UNLABELED).encode()
    elif y.dtype.kind == "O":
        unlabeled = (y == UNLABELED) | (y == str(UNLABELED))
    else:
        unlabeled = y == UNLABELED
    return np.asarray(unlabeled, dtype=bool)


def encode_semi_supervised_labels(y):
    """Split ``y`` into labeled samples and classes, with ``-1`` as unlabeled.

    Parameters
    ----------
    y : ndarray of shape (n_samples,)
        Labels of any type scikit-learn accepts; ``-1`` marks unlabeled samples
        (the string ``"-1"`` in string arrays).

    Returns
    -------
    classes : ndarray of shape (n_classes,)
        Sorted distinct labels of the labeled samples.
    encoded : ndarray of shape (n_samples,)
        Index into ``classes`` of every sample, ``-1`` for unlabeled ones.
    """
    y = np.asarray(y)
    labeled = ~unlabeled_mask(y)
    if not labeled.any():
        raise ValueError(
            "Every label in y is -1 (unlabeled). Association training needs "
            "labeled samples of at least two classes."
        )
    check_label_types(y[labeled])
    check_classification_targets(y[labeled])
    classes, encoded_labeled = np.unique(y[labeled], return_inverse=True)
    if len(classes) < 2:
        raise ValueError(
            f"The labeled samples hold only one class ({classes[:1].tolist()[0]!r}); "
            "this classifier needs labeled samples of at least two classes."
        )
    encoded = np.full(y.shape[0], UNLABELED, dtype=np.int64)
    encoded[labeled] = encoded_labeled
    return classes, encoded


def resolve_device(device):
    """Turn the ``device`` parameter into a :class:`torch.device` that exists here."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device={device!r} is not a device torch knows; use 'auto', 'cpu', "
            "'cuda' or 'cuda:N'."
        ) from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r} but CUDA is not available on this machine "
                "(no GPU, or torch was built without CUDA). Use device='cpu' or "
                "device='auto'."
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r} but this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)."
            )
    elif resolved.type != "cpu":
        raise ValueError(f"device={device!r} is not supported; use 'cpu' or 'cuda'.")
    return resolved


def user_stacklevel():
    """The ``stacklevel`` that points a warning at the first caller outside skassoc.

    For warnings raised deep inside ``fit``: how deep depends on the code
    path (and on scikit-learn's wrappers), so count the frames instead.
    """
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    sklearn_base = os.path.join("sklearn", "base.py")
    frame = inspect.currentframe()
    level = 0
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        ours = filename.startswith(package)
        # scikit-learn's decorator around fit (_fit_context) is not the caller.
        fit_wrapper = filename.endswith(sklearn_base) and frame.f_code.co_name == (
            "wrapper"
        )
        if not (ours or fit_wrapper):
            break
        frame = frame.f_back
        level += 1
    return max(level, 1)
