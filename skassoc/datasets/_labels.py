"""Turn a fully labeled target into a semi-supervised one."""

import numbers
import sys

import numpy as np
from sklearn.utils import check_random_state

from .._inputs import check_label_types
from .._utils import is_integer

__all__ = ["make_semi_supervised_labels"]


def make_semi_supervised_labels(
    y, labeled_per_class, *, random_state=None, unlabeled_label=-1
):
    """Hide all but a few labels per class, for semi-supervised experiments.

    For each class, ``labeled_per_class`` samples are drawn at random
    without replacement and keep their label; every other sample gets
    ``unlabeled_label``, the marker that scikit-learn's semi-supervised
    estimators use for unlabeled samples (-1 by default).

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        Fully labeled target. It must not already contain
        ``unlabeled_label``.

    labeled_per_class : int
        Number of samples of each class that keep their label. Must be at
        least 1 and at most the size of the smallest class.

    random_state : int, RandomState instance or None, default=None
        Controls which samples keep their label. Pass an int for
        reproducible output across multiple function calls.

    unlabeled_label : int, float or str, default=-1
        Value that replaces the hidden labels.

    Returns
    -------
    y_semi : ndarray of shape (n_samples,)
        A copy of ``y`` in which the hidden labels are replaced by
        ``unlabeled_label``. Numeric ``y`` keeps its dtype kind where the
        marker fits (int stays int, float stays float); otherwise the dtype is
        promoted just enough to hold it, e.g. uint8 with -1 becomes int16.
        String or object ``y``, or a non-numeric ``unlabeled_label``, gives an
        object array, so that an int marker such as -1 can sit next to the
        string labels.

    Raises
    ------
    ValueError
        If ``y`` is not 1-D, holds missing labels (NaN, None, pandas' NA),
        if ``labeled_per_class`` is not a positive integer, if a class has
        fewer than ``labeled_per_class`` samples, or if ``y`` already
        contains ``unlabeled_label``.

    Examples
    --------
    >>> import numpy as np
    >>> from skassoc.datasets import make_semi_supervised_labels
    >>> y = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    >>> y_semi = make_semi_supervised_labels(y, 1, random_state=0)
    >>> np.unique(y_semi, return_counts=True)
    (array([-1,  0,  1,  2]), array([6, 1, 1, 1]))
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got an array of shape {y.shape} instead.")
    if not is_integer(labeled_per_class) or labeled_per_class < 1:
        raise ValueError(
            "labeled_per_class must be a positive integer, got "
            f"{labeled_per_class!r} instead."
        )

    _check_no_missing_labels(y)

    numeric_marker = isinstance(unlabeled_label, numbers.Number) and not isinstance(
        unlabeled_label, bool
    )
    if y.dtype.kind in "biuf" and numeric_marker:
        # min_scalar_type, not the marker's Python type, so that e.g. int32
        # labels stay int32 with -1 rather than becoming int64.
        dtype = np.result_type(y.dtype, np.min_scalar_type(unlabeled_label))
    else:
        dtype = np.dtype(object)
    y_semi = y.astype(dtype, copy=True)

    # Compare in the output dtype: comparing a str array with an int marker
    # is not an elementwise operation in numpy. The estimator also reads the
    # string "-1" as unlabeled in string and object labels.
    markers = [unlabeled_label]
    if numeric_marker and unlabeled_label == -1 and y.dtype.kind in "USO":
        markers.append("-1")
    for marker in markers:
        if np.any(y_semi == marker):
            raise ValueError(
                f"y already contains the unlabeled marker {marker!r}; "
                "pass a fully labeled y or a different unlabeled_label."
            )

    check_label_types(y)
    classes, y_indices, counts = np.unique(y, return_inverse=True, return_counts=True)
    too_small = counts < labeled_per_class
    if np.any(too_small):
        details = ", ".join(
            f"{c!r} ({n})"
            for c, n in zip(classes[too_small].tolist(), counts[too_small], strict=True)
        )
        raise ValueError(
            f"labeled_per_class={labeled_per_class} is more than the number of "
            f"samples of these classes: {details}."
        )

    rng = check_random_state(random_state)
    keep = np.zeros(y.shape[0], dtype=bool)
    for k in range(classes.shape[0]):
        members = np.flatnonzero(y_indices == k)
        keep[rng.choice(members, size=labeled_per_class, replace=False)] = True
    y_semi[~keep] = unlabeled_label
    return y_semi


def _missing_labels(y):
    """Where ``y`` holds a missing value: NaN, NaT, None or pandas' NA."""
    if y.dtype.kind in "fc":
        return np.isnan(y)
    if y.dtype.kind in "mM":
        return np.isnat(y)
    if y.dtype.kind != "O":
        return np.zeros(y.shape, dtype=bool)
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        # Knows pandas' NA and NaT too, which only pandas can put in y.
        return np.asarray(pandas.isna(y), dtype=bool)
    return np.array(
        [v is None or (isinstance(v, (float, np.floating)) and v != v) for v in y],
        dtype=bool,
    )


def _check_no_missing_labels(y):
    """Refuse missing labels, which np.unique would make a class of."""
    missing = np.flatnonzero(_missing_labels(y))
    if missing.size:
        raise ValueError(
            f"y holds {missing.size} missing label(s) (NaN or None), e.g. at "
            f"index {missing[0]}; make_semi_supervised_labels needs a fully "
            "labeled y. Drop those samples first; to keep them as unlabeled "
            "samples, call it on the others (y[known]) and set the missing "
            "ones to -1 in the full label array."
        )
