"""Checks and conversions of user inputs: samples, image shapes and labels."""

import math
import unicodedata
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    _check_sample_weight,
    check_array,
    check_consistent_length,
    column_or_1d,
    validate_data,
)

from ._sparse import SparseRows, is_sparse, validate_sparse_rows
from ._utils import is_integer, user_stacklevel

__all__ = [
    "UNLABELED",
    "HELD_OUT",
    "check_not_bytes",
    "as_tensor",
    "split_sample_shape",
    "to_model_layout",
    "encode_semi_supervised_labels",
    "unlabeled_mask",
    "check_label_types",
    "check_sample_shape",
    "check_not_ragged",
    "validate_memory_map",
    "TrainingData",
    "validate_training_inputs",
    "classification_weights",
    "hold_out_validation",
    "inputs_like_training",
    "unfitted_copy",
]

#: The label that marks an unlabeled sample (scikit-learn's convention).
UNLABELED = -1
#: The encoded label of a labeled sample held out of training for validation
#: (``early_stopping``): neither labeled nor in the unlabeled pool.
HELD_OUT = -2


def split_sample_shape(X):
    """Flatten samples of any rank to rows; return the rows and one sample's shape.

    scikit-learn's validation works on 2-D rows, so image batches of shape
    ``(n, h, w)`` or ``(n, c, h, w)`` are validated as ``(n, h*w*c)`` rows and
    reshaped again afterwards. Other inputs (lists, DataFrames) are returned
    as they are, with ``None`` for the shape.
    """
    X = _from_torch(X)
    if isinstance(X, np.ndarray) and X.dtype == object and X.ndim == 1:
        check_not_ragged(X)  # an object array of signals of several lengths
    if isinstance(X, (list, tuple)):
        # A nested list of images: read its shape as NumPy would. Ragged
        # lists get their own message; otherwise odd ones go on as they
        # are, for scikit-learn's.
        try:
            array = np.asarray(X)
        except ValueError:
            check_not_ragged(X)
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


def check_not_ragged(samples):
    """Refuse samples of different shapes, such as signals of several lengths.

    Raises
    ------
    ValueError
        If two of ``samples`` (a sequence of array-likes) differ in shape.
    """
    shapes = {}
    for index, sample in enumerate(samples):
        try:
            shape = np.shape(sample)
        except ValueError:  # itself ragged: a list of channels of two lengths
            shape = "ragged"
        shapes.setdefault(shape, index)
        if len(shapes) > 1:
            break
    if len(shapes) < 2:
        return
    (first, i), (other, j) = shapes.items()
    raise ValueError(
        f"X holds samples of different shapes (sample {i}: {first}, sample "
        f"{j}: {other}); skassoc takes samples of one shape, such as signals "
        "of one length. Resample the signals to one length (e.g. "
        "numpy.interp on a common grid, or scipy.signal.resample), or crop or "
        "pad them, and stack them into one array."
    )


def _from_torch(X):
    """A NumPy array from a torch tensor; a clear error for datasets and loaders.

    Tensors that track gradients, live on a GPU or hold bfloat16 (which NumPy
    lacks) are detached, moved and widened to float32 first.
    """
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu()
        if X.dtype in (torch.bfloat16, torch.float16):
            X = X.float()
        return X.numpy()
    if isinstance(X, (torch.utils.data.Dataset, torch.utils.data.DataLoader)):
        raise TypeError(
            f"X is a torch {type(X).__name__}; skassoc draws its own batches "
            "from arrays. Pass the samples as one array (for a Dataset of "
            "(x, y) pairs: np.stack([x for x, _ in dataset]) and the labels "
            "likewise), or a numpy.memmap for data larger than memory."
        )
    return X


def validate_memory_map(estimator, X, y):
    """scikit-learn's checks of ``fit(X, y)`` for a memory-mapped ``X``.

    ``validate_data`` would flatten ``X`` to rows (a copy of a view that is
    not contiguous, such as :func:`~skassoc.datasets.load_stl10`'s) and
    converts float64 to float32 (another copy). Here the dtype and the
    number of features are checked on the first sample, and float inputs are
    scanned for NaN, infinity and values too large for the networks' float32
    input scaling (and float64 ones for features that float32 would make
    constant, a warning) a few MiB at a time, so ``X`` stays on disk;
    integer inputs are not read at all.

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
    with _large_values_quiet():
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
    rows_per_chunk = max(1, 2**22 // max(1, X.itemsize * math.prod(X.shape[1:])))
    ranges = FeatureRanges()
    for start in range(0, len(X), rows_per_chunk):
        chunk = np.asarray(X[start : start + rows_per_chunk])
        if not np.isfinite(chunk).all():
            raise ValueError(
                "Input X contains NaN or infinity (memory-mapped X, rows "
                f"{start} to {start + len(chunk) - 1})."
            )
        check_magnitude(chunk)
        if X.itemsize > 4:
            ranges.update(chunk, chunk.astype(np.float32))
    ranges.warn_if_float32_hides_variation()


#: The largest magnitude of an input value. Networks scale their inputs in
#: float32: the MLP subtracts each feature's mean, an image network the
#: smallest pixel value, and divides by a spread or range. Values of up to a
#: quarter of float32's largest (3.4e38) keep those differences finite;
#: larger ones overflow to infinity (a raw error while learning the image
#: scale, saturated or NaN network inputs otherwise).
LARGEST_INPUT = float(np.finfo(np.float32).max) / 4


def _large_values_quiet():
    """Silence NumPy's overflow warnings while scikit-learn validates ``X``.

    Its finiteness check first sums ``X``, which overflows for large finite
    values (a RuntimeWarning that says nothing useful), then checks value by
    value; :func:`check_magnitude` explains what is too large.
    """
    return np.errstate(over="ignore", invalid="ignore")


def check_magnitude(rows):
    """Refuse float inputs too large for the networks' float32 input scaling.

    Raises
    ------
    ValueError
        If a value of ``rows`` (any float dtype) lies beyond
        :data:`LARGEST_INPUT` in magnitude.
    """
    if rows.dtype.kind != "f" or rows.itemsize < 4 or rows.size == 0:
        return
    # Two reductions, not np.abs(rows).max(): no copy of the data.
    largest = max(float(rows.max()), -float(rows.min()))
    if not largest <= LARGEST_INPUT:
        raise ValueError(
            f"X holds values too large for float32 arithmetic (up to "
            f"{largest:.3g} in magnitude): the network scales its inputs in "
            f"float32, which overflows for values beyond +-{LARGEST_INPUT:.2g}. "
            "Rescale X, e.g. divide it by a power of ten, or standardise it "
            "(a StandardScaler in a Pipeline)."
        )


class FeatureRanges:
    """Each feature's range in the data and once rounded to float32.

    Features far from 0 against their spread (timestamps, identifiers) can
    vary in float64 and be constant in float32, the precision the networks
    compute in; training would then see nothing of them, silently.
    """

    def __init__(self):
        self.ranges = None

    def update(self, rows, narrow):
        """Take in float ``rows`` of shape (n, ...) (a chunk of the data) and
        ``narrow``, the same rows in float32."""
        rows, narrow = rows.reshape(len(rows), -1), narrow.reshape(len(rows), -1)
        found = [rows.min(0), rows.max(0), narrow.min(0), narrow.max(0)]
        if self.ranges is None:
            self.ranges = found
        else:
            merge = (np.minimum, np.maximum) * 2
            self.ranges = [f(a, b) for f, a, b in zip(merge, self.ranges, found)]

    def warn_if_float32_hides_variation(self):
        """Warn if a feature varies in the data but not in float32."""
        if self.ranges is None:
            return
        low, high, low32, high32 = self.ranges
        hidden = np.flatnonzero((low < high) & (low32 == high32))
        if hidden.size:
            warnings.warn(
                f"{hidden.size} feature(s) of X (e.g. index {hidden[0]}) vary, "
                "but not once rounded to float32, the precision the network "
                "computes in: their values are large against their spread. "
                "Subtract a typical value from them (or standardise X, e.g. "
                "with a StandardScaler in a Pipeline).",
                UserWarning,
                stacklevel=user_stacklevel(),
            )


def resolve_image_shape(sample_shape, input_shape, n_features):
    """The ``(channels, height, width)`` of one image, or None for feature rows.

    A signal is an image one value high: ``input_shape=(length,)`` means
    ``(1, 1, length)`` (and signals of several channels are ``(channels, 1,
    length)``).

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
        if len(shape) in (1, 2):
            # (length,): a signal, one value high; (height, width): grey.
            shape = (1,) * (3 - len(shape)) + shape
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(
                f"input_shape must be (length,) for a signal, (height, width) "
                f"or (channels, height, width) of positive sizes; got "
                f"{input_shape!r}."
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
        if h == 1:
            raise ValueError(
                f"X holds samples of shape {tuple(sample_shape)}, but the model "
                f"was fitted on signals of {c} channel(s) of {w} values, shape "
                f"(channels, 1, length) = {tuple(image_shape)}; pass X as (n, "
                f"{c}, 1, {w}) or as 2-D rows of {c * w} values. Signals of "
                "another length must be resampled to it first."
            )
        grey = f", (n, {h}, {w})" if c == 1 else ""
        raise ValueError(
            f"X holds images of shape {tuple(sample_shape)}, but the model was "
            f"fitted on images of shape (channels, height, width) = "
            f"{tuple(image_shape)}; pass X as (n, {c}, {h}, {w}){grey} or as "
            f"2-D rows of {c * h * w} values."
        )


def as_tensor(array):
    """A torch view of a NumPy array where torch can view it, else a copy.

    torch warns on read-only arrays (its view could be written through) and
    cannot view reversed or non-native byte order arrays: those are copied.
    Copying is the thread-safe way round the warning: silencing it would
    change the process-wide warning filters under other threads' feet.
    """
    if isinstance(array, np.ndarray):
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        if any(step < 0 for step in array.strides) or not array.flags.writeable:
            array = np.array(array)
    return torch.as_tensor(array)


def to_model_layout(rows, image_shape):
    """Reshape validated rows to what the network takes, in its storage dtype.

    uint8 pixels stay uint8 (a quarter of the memory, on the host and on the
    GPU; networks convert per batch); everything else becomes float32.

    Raises
    ------
    ValueError
        If float values are too large for the networks' input scaling (see
        :func:`check_magnitude`).
    """
    if rows.dtype != np.uint8:
        # Before the conversion: float64 values beyond float32's range would
        # become infinity there.
        check_magnitude(rows)
        rows = rows.astype(np.float32, copy=False)
    if image_shape is None:
        return rows
    return rows.reshape(rows.shape[0], *image_shape)


def sparse_model_layout(rows):
    """Validated sparse rows as the networks take them: :class:`SparseRows`
    of float32 values (see :func:`to_model_layout` for the magnitude check)."""
    check_magnitude(rows.data)
    return SparseRows(rows.astype(np.float32, copy=False))


def _check_sparse_layout(input_shape):
    """Refuse ``input_shape`` with sparse ``X`` (its rows are features, never
    images); None, the shape of a sample of 2-D rows."""
    if input_shape is not None:
        raise ValueError(
            f"input_shape={tuple(input_shape)} describes images, but X is sparse: "
            "sparse rows are feature vectors. Leave input_shape=None, or pass "
            "the images as a dense array."
        )
    return None


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


def check_not_bytes(y):
    """Refuse bytes labels, whatever scikit-learn's version says of them.

    scikit-learn 1.6 only deprecates them (and trains on them), later
    versions refuse them; skassoc refuses them always.
    """
    kind = y.dtype.kind
    if kind == "S" or (kind == "O" and any(isinstance(v, bytes) for v in y.flat)):
        raise TypeError(
            "y holds bytes labels (e.g. b'cat'), which skassoc does not "
            "accept. Decode them to strings first, e.g. y.astype(str) or "
            "np.char.decode(y) (the unlabeled marker then is the string "
            "'-1'), or use integer labels."
        )


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
    check_not_bytes(y)
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


def is_memory_map(X):
    """Whether ``X`` is (a view of) a :class:`numpy.memmap`."""
    while X is not None:
        if isinstance(X, np.memmap):
            return True
        X = getattr(X, "base", None)
    return False


def warn_if_channels_last(sample_shape):
    """Warn when images look like (h, w, c) but will be read as (c, h, w)."""
    if sample_shape is None or len(sample_shape) != 3:
        return
    channels, height, width = sample_shape
    if channels > 4 and width in (1, 3, 4):
        warnings.warn(
            f"X holds images of shape {tuple(sample_shape)}, read as (channels, "
            f"height, width) = ({channels}, {height}, {width}). If they are "
            "channels-last (height, width, channels) images, pass "
            "np.moveaxis(X, -1, 1) instead.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def warn_if_marker_wrapped(y):
    """Warn when an unsigned ``y`` looks like ``-1`` wrapped round to its maximum.

    ``np.where(mask, y_uint8, -1)`` gives 255, not -1, under NumPy 2: the
    unlabeled samples then become one large extra class. An unsigned label
    array whose largest value marks most samples is almost always that.
    """
    if y.dtype.kind != "u" or len(y) == 0:
        return
    top = y.max()
    if top == np.iinfo(y.dtype).max and np.count_nonzero(y == top) > len(y) / 2:
        warnings.warn(
            f"y is {y.dtype} and {np.count_nonzero(y == top)} of its {len(y)} "
            f"labels are {top}, its largest value: is that -1 wrapped round "
            "(np.where(mask, y, -1) on unsigned labels)? Those samples are "
            f"trained as labeled class {top}. Build y as signed integers: "
            "np.where(mask, y.astype(np.int64), -1).",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


# Characters typed (or put in by word processors and spreadsheets) for a
# minus sign besides the ASCII hyphen-minus; Unicode's dashes (category Pd)
# are read as minus signs too.
_MINUS_SIGNS = frozenset("\u2212\u02d7\u2796")


def reads_as_marker(label):
    """Whether a string label reads as the number -1 although it is not ``"-1"``.

    The near misses of the unlabeled marker: ``" -1"``, ``"-1.0"`` (what
    ``astype(str)`` makes of a float -1), ``"\u22121"`` (a Unicode minus),
    full-width or quoted forms. Labels that merely contain ``-1``
    (``"-10"``, ``"class-1"``) are not near misses.
    """
    if not isinstance(label, str) or label == str(UNLABELED):
        return False
    text = unicodedata.normalize("NFKC", label)
    text = "".join(
        "-" if char in _MINUS_SIGNS or unicodedata.category(char) == "Pd" else char
        for char in text
        # Format characters (a byte-order mark, zero-width spaces) and
        # whitespace are invisible in a printed label.
        if unicodedata.category(char) != "Cf" and not char.isspace()
    )
    text = text.strip("\"'").replace(",", ".")
    try:
        return float(text) == UNLABELED
    except ValueError:
        return False


def warn_if_marker_misspelled(classes, encoded):
    """Warn when a class of ``y`` looks like a mistyped unlabeled marker.

    Only the integer -1 (and the string ``"-1"`` in string and object
    labels) marks unlabeled samples; a near miss such as ``"-1.0"`` (see
    :func:`reads_as_marker`) becomes a class of its own, which usually
    holds most samples.
    """
    if classes.dtype.kind not in "UO":
        return
    labels = classes.tolist()
    suspects = [k for k, label in enumerate(labels) if reads_as_marker(label)]
    if not suspects:
        return
    counts = np.bincount(encoded[encoded >= 0], minlength=len(classes))
    found = ", ".join(f"{labels[k]!r} ({counts[k]} samples)" for k in suspects)
    warnings.warn(
        f"y holds the class(es) {found}, which read as -1: are they the "
        "unlabeled marker, mistyped? Only the exact -1 (or the string '-1') "
        "marks unlabeled samples; these samples are trained as labeled. "
        "Replace the marker, e.g. y = np.where(y == "
        f"{labels[suspects[0]]!r}, '-1', y).",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def unfitted_copy(estimator, **fitted):
    """A parameter-only copy of ``estimator`` for scikit-learn's checks.

    ``validate_data`` records the number and names of the features on the
    estimator it is given; a fit hands it this copy, so that the estimator's
    own fitted state changes only once training has succeeded. ``fitted``
    sets attributes (such as ``n_features_in_``) for checks at inference.
    """
    probe = type(estimator).__new__(type(estimator))
    probe.__dict__.update(estimator.get_params(deep=False))
    probe.__dict__.update(fitted)
    return probe


@dataclass
class TrainingData:
    """Validated training inputs, in the layout the network takes.

    Attributes
    ----------
    data : ndarray or numpy.memmap
        Every sample: rows for feature vectors, ``(n, c, h, w)`` for images.
        A memory map is the caller's own (never copied).
    encoded : ndarray of shape (n_samples,)
        Index into ``classes`` of every sample, ``-1`` for unlabeled ones.
    classes : ndarray of shape (n_classes,)
        Sorted labels of the labeled samples.
    image_shape : tuple of int or None
        ``(channels, height, width)`` of one image; None for feature rows.
    n_features : int
        Values in one sample.
    feature_names : ndarray or None
        Column names of a DataFrame ``X`` (scikit-learn's rules), else None.
    on_host : bool
        Whether ``data`` is a memory map that batches are gathered from.
    sample_weight : ndarray of shape (n_samples,) or None
        ``fit``'s sample weights, validated (float64, non-negative).
    """

    data: object
    encoded: np.ndarray
    classes: np.ndarray
    image_shape: tuple | None
    n_features: int
    feature_names: object = None
    on_host: bool = False
    sample_weight: np.ndarray | None = None

    @property
    def images(self):
        """Whether the samples are images."""
        return self.image_shape is not None

    @property
    def sparse(self):
        """Whether the samples are sparse rows (:class:`SparseRows`)."""
        return isinstance(self.data, SparseRows)


def validate_training_inputs(estimator, X, y, sample_weight=None):
    """Check ``fit``'s ``X``, ``y`` and ``sample_weight``; the estimator is untouched.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        Gives ``input_shape`` and scikit-learn's input tags.
    X, y, sample_weight
        As passed to ``fit``.

    Returns
    -------
    inputs : TrainingData
    """
    probe = unfitted_copy(estimator)
    on_host = is_memory_map(X)
    if on_host:
        # Validated and used where it is: never copied or read whole.
        y = validate_memory_map(probe, X, y)
        sample_shape = tuple(X.shape[1:]) if X.ndim > 2 else None
    elif is_sparse(X):
        rows, y = validate_sparse_rows(probe, X, y)
        sample_shape = _check_sparse_layout(estimator.input_shape)
    else:
        rows, sample_shape = split_sample_shape(X)
        with _large_values_quiet():
            rows, y = validate_data(probe, rows, y, dtype="numeric", y_numeric=False)
    n_features = probe.n_features_in_
    image_shape = resolve_image_shape(sample_shape, estimator.input_shape, n_features)
    if estimator.input_shape is None:
        warn_if_channels_last(sample_shape)
    warn_if_marker_wrapped(y)
    classes, encoded = encode_semi_supervised_labels(y)
    warn_if_marker_misspelled(classes, encoded)
    if on_host:
        # Adding the channel axis of (n, h, w) images is a view, never a copy.
        data = X if image_shape is None else X.reshape(len(X), *image_shape)
    elif is_sparse(rows):
        data = sparse_model_layout(rows)
    else:
        data = to_model_layout(rows, image_shape)
        if rows.dtype.kind == "f" and rows.dtype.itemsize > 4:
            ranges = FeatureRanges()
            ranges.update(rows, data)
            ranges.warn_if_float32_hides_variation()
    if sample_weight is not None:
        sample_weight = _check_sample_weight(
            sample_weight, data, dtype=np.float64, ensure_non_negative=True
        )
    return TrainingData(
        data=data,
        encoded=encoded,
        classes=classes,
        image_shape=image_shape,
        n_features=n_features,
        feature_names=getattr(probe, "feature_names_in_", None),
        on_host=on_host,
        sample_weight=sample_weight,
    )


def classification_weights(class_weight, inputs):
    """Factors on the classification loss of every sample, or None if all equal.

    The class weight of its class (``"balanced"``: scikit-learn's
    :func:`~sklearn.utils.class_weight.compute_class_weight` on the labeled
    training samples) times its sample weight, rescaled to average 1 over
    the labeled training samples, so that the classification loss keeps its
    scale next to the walker and visit losses. Unlabeled and held-out
    samples get 0: their weights are never used.

    Raises
    ------
    ValueError
        If the labeled samples' weights are all zero, or ``class_weight``
        names labels that are not classes.
    """
    labeled = inputs.encoded >= 0
    if isinstance(class_weight, dict):
        _check_class_weight_dict(class_weight, inputs.classes)
    factors = np.ones(np.count_nonzero(labeled))
    if class_weight is not None:
        per_class = compute_class_weight(
            class_weight,
            classes=inputs.classes,
            y=inputs.classes[inputs.encoded[labeled]],
        )
        factors = _relative(per_class)[inputs.encoded[labeled]]
    if inputs.sample_weight is not None:
        factors = factors * _relative(inputs.sample_weight[labeled])
    mean = factors.mean()
    if not mean > 0:
        raise ValueError(
            "The class and sample weights of every labeled sample are 0: the "
            "classification loss would have nothing to learn from. Give some "
            "labeled samples a positive weight (weights of unlabeled samples "
            "are not used)."
        )
    if np.all(factors == factors[0]):
        return None
    weights = np.zeros(len(inputs.encoded), dtype=np.float32)
    weights[labeled] = factors / mean
    return weights


def _relative(weights):
    """``weights`` divided by their largest (unchanged if all are 0).

    Only ratios of weights matter. Large finite weights (1e308) would
    overflow their product and their mean to infinity, and every factor
    divided by it would be 0: the fit would silently be an unweighted one.
    """
    largest = weights.max(initial=0.0)
    return weights / largest if largest > 0 else weights


def _check_class_weight_dict(class_weight, classes):
    unknown = [key for key in class_weight if key not in set(classes.tolist())]
    if unknown:
        raise ValueError(
            f"class_weight has weights for {unknown[:5]!r}, which are not "
            f"classes of the labeled samples ({classes.tolist()[:10]!r}); use "
            "the labels of y (and their type) as keys."
        )
    weights = np.asarray(list(class_weight.values()), dtype=float)
    if not (np.isfinite(weights).all() and (weights >= 0).all()):
        raise ValueError(
            "class_weight values must be finite and non-negative; got "
            f"{list(class_weight.values())[:5]!r}."
        )


def hold_out_validation(inputs, fraction, seed):
    """Split labeled samples off ``inputs`` for validation (``early_stopping``).

    A stratified ``fraction`` of the labeled samples is held out: their
    encoded label becomes :data:`HELD_OUT`, so they are neither in the
    labeled batches nor in the unlabeled pool.

    Returns
    -------
    inputs : TrainingData
        The training data without the held-out samples (the same array).
    validation : tuple of (ndarray, ndarray)
        The held-out inputs in the model's layout and their labels.

    Raises
    ------
    ValueError
        If the labeled samples are too few to split by class.
    """
    labeled = np.flatnonzero(inputs.encoded >= 0)
    counts = np.bincount(inputs.encoded[labeled], minlength=len(inputs.classes))
    advice = (
        "Label more samples, change validation_fraction, or pass X_val and "
        "y_val to fit instead."
    )
    if counts.min() < 2:
        smallest = inputs.classes[np.argmin(counts)]
        raise ValueError(
            f"early_stopping=True holds out validation_fraction={fraction} of "
            "the labeled samples, stratified by class, which needs at least 2 "
            f"labeled samples of every class; class {smallest!r} has "
            f"{counts.min()}. {advice}"
        )
    try:
        train, held_out = train_test_split(
            labeled,
            test_size=fraction,
            random_state=seed,
            stratify=inputs.encoded[labeled],
        )
    except ValueError as exc:
        raise ValueError(
            f"early_stopping=True cannot hold out validation_fraction="
            f"{fraction} of the {len(labeled)} labeled samples, stratified by "
            f"class ({len(inputs.classes)} classes): {str(exc).rstrip('.')}. "
            f"{advice}"
        ) from exc
    left = np.bincount(inputs.encoded[train], minlength=len(inputs.classes))
    if left.min() < 1:
        raise ValueError(
            f"early_stopping=True with validation_fraction={fraction} leaves "
            f"class {inputs.classes[np.argmin(left)]!r} without labeled "
            f"training samples. {advice}"
        )
    held_out = np.sort(held_out)
    encoded = inputs.encoded.copy()
    encoded[held_out] = HELD_OUT
    validation = (
        np.asarray(inputs.data[held_out]),
        inputs.classes[inputs.encoded[held_out]],
    )
    return replace(inputs, encoded=encoded), validation


def inputs_like_training(probe, X, image_shape):
    """``X`` checked against the training inputs, in the model's layout.

    ``probe`` carries the fitted ``n_features_in_`` (and
    ``feature_names_in_``) that scikit-learn's checks compare ``X`` with.
    """
    if is_sparse(X):
        if image_shape is not None:
            raise ValueError(
                "X is sparse, but the model was fitted on images of shape "
                f"(channels, height, width) = {tuple(image_shape)}; pass them "
                "as a dense array."
            )
        rows, _ = validate_sparse_rows(probe, X, reset=False)
        return sparse_model_layout(rows)
    rows, sample_shape = split_sample_shape(X)
    with _large_values_quiet():
        rows = validate_data(probe, rows, dtype="numeric", reset=False)
    check_sample_shape(sample_shape, image_shape, probe.n_features_in_)
    return to_model_layout(rows, image_shape)
