"""The report's second opinion: labels spread over the inputs (_input_view)."""

import warnings

import numpy as np
import pytest
import scipy.sparse
from sklearn.decomposition import PCA

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._input_view import (
    INPUT_CLIP,
    PROJECTED_FEATURES,
    VIEW_DIMENSIONS,
    _reduced,
    spread_labels,
)


def _two_groups(n_features, rng, n=200):
    """Rows of two separated groups, the first 5 of each labeled."""
    centres = np.zeros((2, n_features))
    centres[1, :] = 1.0
    y = np.repeat([0, 1], n // 2)
    X = centres[y] + 0.1 * rng.standard_normal((n, n_features))
    labeled = np.concatenate([np.arange(5), n // 2 + np.arange(5)])
    unlabeled = np.setdiff1d(np.arange(n), labeled)
    return X.astype(np.float32), y, labeled, unlabeled


@pytest.mark.parametrize("n_features", [3, 80, PROJECTED_FEATURES + 100])
def test_labels_spread_to_the_rows_near_them(n_features):
    # Narrow rows, rows reduced by PCA, and rows projected at random first.
    X, y, labeled, unlabeled = _two_groups(n_features, np.random.default_rng(0))
    spread = spread_labels(lambda rows: X[rows], labeled, y[labeled], unlabeled, 0)
    np.testing.assert_array_equal(spread, y[unlabeled])


def test_dense_rows_are_reduced_by_an_exact_pca():
    # The leading components themselves, not an approximation of their span:
    # the same as a full SVD's, up to each component's sign.
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((300, 120)) * np.linspace(0.1, 5, 120)).astype(
        np.float32
    )
    view = _reduced(rows, seed=0)
    standardized = (rows - rows.mean(0)) / rows.std(0)
    bounded = INPUT_CLIP * np.tanh(standardized / INPUT_CLIP)
    exact = PCA(VIEW_DIMENSIONS, svd_solver="full").fit_transform(bounded)
    signs = np.sign(np.sum(view * exact, axis=0))
    np.testing.assert_allclose(view * signs, exact, atol=2e-3)


def test_images_and_sparse_rows_spread_too():
    X, y, labeled, unlabeled = _two_groups(64, np.random.default_rng(1))
    images = X.reshape(-1, 1, 8, 8)
    spread = spread_labels(lambda rows: images[rows], labeled, y[labeled], unlabeled, 0)
    np.testing.assert_array_equal(spread, y[unlabeled])
    # Sparse rows: each group uses its own 30 of 60 columns.
    rng = np.random.default_rng(2)
    dense = np.zeros((200, 60), np.float32)
    for row, group in enumerate(y):
        dense[row, rng.choice(30, 8, replace=False) + 30 * group] = 1.0
    rows = scipy.sparse.csr_matrix(dense)
    spread = spread_labels(lambda i: rows[i], labeled, y[labeled], unlabeled, 0)
    assert np.mean(spread == y[unlabeled]) > 0.95
    # Rows wider than the projection: projected, never densified whole.
    wide = scipy.sparse.hstack([rows, scipy.sparse.csr_matrix((200, 100_000))])
    wide = wide.tocsr()
    spread = spread_labels(lambda i: wide[i], labeled, y[labeled], unlabeled, 0)
    assert np.mean(spread == y[unlabeled]) > 0.9


def test_rows_no_label_reaches_have_no_opinion_and_constant_inputs_are_quiet():
    X, y, labeled, unlabeled = _two_groups(4, np.random.default_rng(3))
    # A third group far away, none of it labeled: it keeps no class, not
    # the first class (LabelSpreading's reading of an empty distribution).
    far = 40 + 0.1 * np.random.default_rng(4).standard_normal((100, 4))
    X = np.concatenate([X, far.astype(np.float32)])
    unlabeled = np.concatenate([unlabeled, 200 + np.arange(100)])
    for codes in (y[labeled], 1 - y[labeled]):
        spread = spread_labels(lambda rows: X[rows], labeled, codes, unlabeled, 0)
        assert np.all(spread[-100:] == -1)
    constant = np.zeros((80, 100), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spread_labels(
            lambda rows: constant[rows],
            np.arange(4),
            np.array([0, 0, 1, 1]),
            np.arange(40, 80),
            0,
        )


def test_a_single_labeled_class_spreads_nothing():
    X, y, labeled, unlabeled = _two_groups(3, np.random.default_rng(0))
    assert spread_labels(lambda rows: X[rows], labeled[:5], y[:5], unlabeled, 0) is None
    none_to_spread = unlabeled[:0]
    assert spread_labels(lambda i: X[i], labeled, y[labeled], none_to_spread, 0) is None


def test_a_fit_with_known_shares_reports_the_inputs_opinion():
    # Three groups, the first twice as frequent as the others, labels 4 a
    # class and class_prior="uniform": the first class exceeds its share.
    # The inputs put its samples among its labels, and mix up the two
    # other groups, which overlap: the excess class is the one they agree
    # with best, and they clear it.
    rng = np.random.default_rng(0)
    centres = 4 * np.eye(3, 6)
    centres[2] = centres[1] + 0.5 * np.eye(1, 6, 2)[0]
    y = np.repeat([0, 1, 2], [300, 150, 150])
    X = (centres[y] + 0.3 * rng.standard_normal((600, 6))).astype(np.float32)
    y_semi = np.full(600, -1)
    for c in range(3):
        y_semi[np.flatnonzero(y == c)[:4]] = c
    clf = SemiSupervisedAssociationClassifier(
        max_iter=60, class_prior="uniform", random_state=0, device="cpu"
    ).fit(X, y_semi)
    report = clf.fit_report_
    assert report.scores["class_share_excess"] == pytest.approx(1 / 6, abs=0.02)
    assert report.scores["excess_class_input_disagreement"] < -0.05
    assert report.verdict == "ok"
