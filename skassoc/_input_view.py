"""A second opinion for ``fit_report_``: the labels spread over the inputs.

The network, its predictions and the association graph all see the samples
through one embedding, so a region that the network hands to the wrong
class looks, in that graph, like a region of that class. The inputs do not
depend on the fit: spreading the labels over a nearest-neighbour graph of
the inputs (scikit-learn's :class:`~sklearn.semi_supervised.LabelSpreading`)
gives each sample a class that the fit cannot have bent. That class is
often wrong (raw distances are a weak classifier), but a class's error
rate is about the same whichever fit it is compared with, so the report
compares a class with the others of the same fit.
"""

import warnings

import numpy as np
import scipy.sparse
from sklearn.decomposition import PCA, TruncatedSVD
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler
from sklearn.random_projection import (
    GaussianRandomProjection,
    SparseRandomProjection,
)
from sklearn.semi_supervised import LabelSpreading

__all__ = ["spread_labels"]

#: Dimensions the inputs are reduced to (PCA; a truncated SVD of sparse
#: rows): enough for the neighbours of digit images, few enough for a fast
#: neighbour search.
VIEW_DIMENSIONS = 50
#: Rows of more values than this are first projected at random to this
#: many, a chunk at a time (distances survive a random projection): 12,000
#: colour images of 96x96 pixels would take 1.3 GB as float32, and a
#: truncated SVD of rows of 400,000 sparse features holds dense matrices of
#: that width. Sparse rows get a sparse projection, whose matrix stays
#: small however wide the rows.
PROJECTED_FEATURES = 512
#: Neighbours of each sample in the graph the labels spread over.
NEIGHBOURS = 10
#: Standardised values are bounded to about this many standard deviations,
#: as the MLP bounds its inputs: a rare value of a nearly constant feature
#: would otherwise decide the neighbours.
INPUT_CLIP = 3.0
#: Rows read from the training data at once.
CHUNK = 1_024


def spread_labels(features, labeled, y_labeled, unlabeled, seed):
    """Classes of the unlabeled rows from the labels spread over the inputs.

    Parameters
    ----------
    features : callable
        ``features(indices)`` returns those training rows: an ndarray (any
        shape; flattened here) or a SciPy sparse matrix.
    labeled : ndarray of int
        Indices of the labeled rows.
    y_labeled : ndarray of shape (len(labeled),)
        Their encoded labels.
    unlabeled : ndarray of int
        Indices of the rows to classify.
    seed : int
        Seeds the random projection and the truncated SVD.

    Returns
    -------
    classes : ndarray of shape (len(unlabeled),) or None
        -1 for rows that no label reaches (no opinion, which disagrees with
        every class); None when the labels cannot spread (fewer than two
        classes, or too few rows for a neighbour).
    """
    n_rows = len(labeled) + len(unlabeled)
    if len(np.unique(y_labeled)) < 2 or len(unlabeled) == 0 or n_rows < 3:
        return None
    rows = _rows(features, np.concatenate([labeled, unlabeled]), seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Constant inputs have no variance to explain: the reductions'
        # explained-variance ratios divide by zero, which nothing reads.
        view = _reduced(rows, seed)
    target = np.concatenate([y_labeled, np.full(len(unlabeled), -1)])
    spreading = LabelSpreading(
        kernel="knn", n_neighbors=min(NEIGHBOURS, n_rows - 1), max_iter=100
    )
    with warnings.catch_warnings():
        # The classes settle long before the spread values meet
        # LabelSpreading's tolerance; only the classes are read.
        warnings.simplefilter("ignore", ConvergenceWarning)
        spreading.fit(view, target)
    classes = spreading.transduction_[len(labeled) :].copy()
    # A row without a path to any label keeps an empty distribution, which
    # transduction_ reads as the first class: it has no opinion instead.
    reached = spreading.label_distributions_[len(labeled) :].sum(1) > 0
    classes[~reached] = -1
    return classes


def _rows(features, indices, seed):
    """The rows of ``indices``: sparse as given, dense flattened to float32,
    both projected at random (to dense rows) when wider than
    :data:`PROJECTED_FEATURES`."""
    chunks, projection = [], None
    for start in range(0, len(indices), CHUNK):
        rows = features(indices[start : start + CHUNK])
        sparse = scipy.sparse.issparse(rows)
        if not sparse:
            rows = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
        if rows.shape[1] > PROJECTED_FEATURES:
            if projection is None:
                kind = SparseRandomProjection if sparse else GaussianRandomProjection
                kwargs = {"dense_output": True} if sparse else {}
                projection = kind(PROJECTED_FEATURES, random_state=seed, **kwargs).fit(
                    rows[:1]
                )
            rows = np.asarray(projection.transform(rows), dtype=np.float32)
        chunks.append(rows)
    if scipy.sparse.issparse(chunks[0]):
        return scipy.sparse.vstack(chunks, format="csr")
    return np.concatenate(chunks)


def _reduced(rows, seed):
    """Rows of at most :data:`VIEW_DIMENSIONS` values."""
    n_rows, n_features = rows.shape
    dimensions = min(VIEW_DIMENSIONS, n_rows - 1)
    if scipy.sparse.issparse(rows):
        # Sparse rows (tf-idf, counts) are compared as given, uncentred.
        if n_features <= dimensions:
            return rows.toarray()
        return TruncatedSVD(dimensions, random_state=seed).fit_transform(rows)
    standardized = StandardScaler().fit_transform(rows)
    bounded = INPUT_CLIP * np.tanh(standardized / INPUT_CLIP)
    if n_features <= dimensions:
        return bounded
    # The covariance's eigenvectors: exact, and quicker than the randomised
    # solver's power iterations, for rows of at most PROJECTED_FEATURES
    # values (the covariance is that wide).
    return PCA(dimensions, svd_solver="covariance_eigh").fit_transform(bounded)
