"""Tests of skassoc.plotting on tiny fitted estimators (Agg backend)."""

import sys

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.metrics.pairwise import cosine_similarity

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
from matplotlib.offsetbox import AnnotationBbox  # noqa: E402

from skassoc import SemiSupervisedAssociationClassifier  # noqa: E402
from skassoc.plotting import (  # noqa: E402
    LABELED_COLOR,
    MISCLASSIFIED_COLOR,
    UNLABELED_COLOR,
    plot_association_graph,
    plot_nearest_neighbors,
)

N_PER_CLASS = 2  # labeled samples of each class in the drawn batch A
N_UNLABELED = 15


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def images_fitted(_digits, fast_params, torch_single_thread):
    """An MLP fitted for a few steps on 8x8 digit images (n, 8, 8) uint8."""
    X, y = _digits
    X = X[:200].reshape(-1, 8, 8).astype(np.uint8)
    y = y[:200].copy()
    y_semi = np.where(np.arange(len(y)) < 100, y, -1)
    params = {**fast_params, "max_iter": 5}
    clf = SemiSupervisedAssociationClassifier(**params).fit(X, y_semi)
    return clf, X, y


@pytest.fixture
def batches(images_fitted):
    """A labeled batch of N_PER_CLASS per class and an unlabeled batch."""
    clf, X, y = images_fitted
    labeled = np.concatenate(
        [np.flatnonzero(y == k)[:N_PER_CLASS] for k in np.unique(y)]
    )
    unlabeled = np.setdiff1d(np.arange(len(y)), labeled)[:N_UNLABELED]
    return clf, X[labeled], y[labeled], X[unlabeled]


def _line_collections(ax):
    return [c for c in ax.collections if isinstance(c, LineCollection)]


def _alpha_sums_by_start(collection):
    """Sum of line opacities per start point: one row of P_ab or P_ba each."""
    starts = np.array([segment[0, 0] for segment in collection.get_segments()])
    alphas = collection.get_colors()[:, 3]
    return np.array([alphas[np.isclose(starts, x)].sum() for x in np.unique(starts)])


def test_association_graph_draws_every_transition(batches, torch_single_thread):
    clf, X_labeled, y_labeled, X_unlabeled = batches
    n_labeled = len(X_labeled)

    fig = plot_association_graph(clf, X_labeled, y_labeled, X_unlabeled)

    assert isinstance(fig, matplotlib.figure.Figure)
    (ax,) = fig.axes
    forward, backward = _line_collections(ax)
    assert len(forward.get_segments()) == n_labeled * N_UNLABELED
    assert len(backward.get_segments()) == n_labeled * N_UNLABELED
    # Opacity is the transition probability: the lines leaving one sample
    # are a probability distribution.
    np.testing.assert_allclose(_alpha_sums_by_start(forward), 1.0, rtol=1e-6)
    np.testing.assert_allclose(_alpha_sums_by_start(backward), 1.0, rtol=1e-6)
    assert len(_alpha_sums_by_start(forward)) == n_labeled
    assert len(_alpha_sums_by_start(backward)) == N_UNLABELED
    # A twice (top and bottom rows) and B once, as thumbnails.
    boxes = [a for a in ax.artists if isinstance(a, AnnotationBbox)]
    assert len(boxes) == 2 * n_labeled + N_UNLABELED
    frame_colors = [matplotlib.colors.to_hex(b.patch.get_edgecolor()) for b in boxes]
    assert frame_colors.count(matplotlib.colors.to_hex(LABELED_COLOR)) == 2 * n_labeled
    assert frame_colors.count(matplotlib.colors.to_hex(UNLABELED_COLOR)) == N_UNLABELED
    assert "%" in ax.get_xlabel()


def test_association_graph_max_lines_keeps_most_probable(batches, torch_single_thread):
    clf, X_labeled, y_labeled, X_unlabeled = batches
    full = plot_association_graph(clf, X_labeled, y_labeled, X_unlabeled)
    fig = plot_association_graph(
        clf, X_labeled, y_labeled, X_unlabeled, max_lines=7, show_images=False
    )

    for all_lines, kept in zip(
        _line_collections(full.axes[0]), _line_collections(fig.axes[0]), strict=True
    ):
        assert len(kept.get_segments()) == 7
        np.testing.assert_allclose(
            np.sort(kept.get_colors()[:, 3]),
            np.sort(all_lines.get_colors()[:, 3])[-7:],
        )


def test_association_graph_markers_without_images(batches, torch_single_thread):
    clf, X_labeled, y_labeled, X_unlabeled = batches
    _, ax = plt.subplots()

    fig = plot_association_graph(
        clf, X_labeled, y_labeled, X_unlabeled, ax=ax, show_images=False
    )

    assert fig is ax.figure
    assert not [a for a in ax.artists if isinstance(a, AnnotationBbox)]
    markers = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert [len(c.get_offsets()) for c in markers] == [
        len(X_labeled),
        N_UNLABELED,
        len(X_labeled),
    ]
    # Labeled samples carry their class, sorted.
    texts = [t.get_text() for t in ax.texts]
    assert texts == sorted(str(label) for label in y_labeled)


def test_association_graph_feature_rows(blobs_semi, fast_params, torch_single_thread):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    labeled = np.flatnonzero(y != -1)[:6]
    unlabeled = np.flatnonzero(y == -1)[:5]

    fig = plot_association_graph(clf, X[labeled], y[labeled], X[unlabeled])

    ax = fig.axes[0]
    assert sum(len(c.get_segments()) for c in _line_collections(ax)) == 2 * 6 * 5
    assert not [a for a in ax.artists if isinstance(a, AnnotationBbox)]


def test_association_graph_checks_label_count(batches):
    clf, X_labeled, y_labeled, X_unlabeled = batches
    with pytest.raises(ValueError, match="labels for"):
        plot_association_graph(clf, X_labeled, y_labeled[:-1], X_unlabeled)
    with pytest.raises(ValueError, match="must be 1-D"):
        plot_association_graph(clf, X_labeled, y_labeled[:, None], X_unlabeled)


@pytest.mark.parametrize("max_lines", [0, -5, 2.5, True])
def test_association_graph_checks_max_lines(batches, max_lines):
    clf, X_labeled, y_labeled, X_unlabeled = batches
    with pytest.raises(ValueError, match="max_lines must be a positive int"):
        plot_association_graph(
            clf, X_labeled, y_labeled, X_unlabeled, max_lines=max_lines
        )


def test_association_graph_row_labels_fit_in_the_figure(batches):
    clf, X_labeled, y_labeled, X_unlabeled = batches
    fig = plot_association_graph(clf, X_labeled[:4], y_labeled[:4], X_unlabeled[:4])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for label in fig.axes[0].get_yticklabels():
        assert label.get_window_extent(renderer).x0 >= 0, label.get_text()


def _zoom(ax):
    return [a.offsetbox.get_zoom() for a in ax.artists if isinstance(a, AnnotationBbox)]


def test_association_graph_in_a_subfigure(batches):
    clf, X_labeled, y_labeled, X_unlabeled = batches
    root = plt.figure(figsize=(10, 4))
    ax = root.subfigures(1, 2)[0].subplots()
    fig = plot_association_graph(clf, X_labeled, y_labeled, X_unlabeled, ax=ax)
    assert fig is root
    # Thumbnails sized like those of axes of the same size in a plain figure.
    _, plain = plt.subplots(figsize=(5, 4))
    plot_association_graph(clf, X_labeled, y_labeled, X_unlabeled, ax=plain)
    assert _zoom(ax) and _zoom(ax) == pytest.approx(_zoom(plain))


def test_nearest_neighbors_shows_sorted_cosine_similarities(
    images_fitted, torch_single_thread
):
    clf, X, y = images_fitted
    X_query, X_pool = X[:3], X[3:60]
    n_neighbors = 4

    fig = plot_nearest_neighbors(clf, X_query, X_pool, n_neighbors=n_neighbors)

    assert isinstance(fig, matplotlib.figure.Figure)
    axes = np.array(fig.axes).reshape(3, n_neighbors + 1)
    assert all(len(ax.images) == 1 for ax in axes.ravel())
    expected = np.sort(
        cosine_similarity(clf.transform(X_query), clf.transform(X_pool)), axis=1
    )[:, ::-1][:, :n_neighbors]
    for row, ax_row in enumerate(axes):
        assert ax_row[0].get_xlabel() == "query"
        shown = np.array([float(ax.get_xlabel()) for ax in ax_row[1:]])
        assert np.all(np.diff(shown) <= 0)
        assert np.all((shown >= -1) & (shown <= 1))
        np.testing.assert_allclose(shown, expected[row], atol=1e-3)


def test_nearest_neighbors_frames_by_label(images_fitted, torch_single_thread):
    clf, X, y = images_fitted
    # The query is in the pool, so its nearest neighbour is itself.
    fig = plot_nearest_neighbors(
        clf,
        X[:2],
        X[:50],
        n_neighbors=3,
        y_query=y[:2],
        y_pool=y[:50],
        mark_misclassified=False,
    )

    axes = np.array(fig.axes).reshape(2, 4)
    for ax_row in axes:
        first = ax_row[1]
        assert float(first.get_xlabel()) == pytest.approx(1.0, abs=1e-3)
        np.testing.assert_array_equal(
            first.images[0].get_array(), ax_row[0].images[0].get_array()
        )
        edge = first.spines["top"].get_edgecolor()
        assert matplotlib.colors.same_color(edge, LABELED_COLOR)
    assert axes[0, 0].get_xlabel() == f"query ({y[0]})"


def test_nearest_neighbors_marks_misclassified_queries(
    images_fitted, torch_single_thread
):
    clf, X, y = images_fitted
    predicted = clf.predict(X)
    wrong = np.flatnonzero(predicted != y)
    right = np.flatnonzero(predicted == y)
    assert len(wrong) and len(right), "the fixture's model must make mistakes"
    queries = np.array([right[0], wrong[0]])

    fig = plot_nearest_neighbors(
        clf, X[queries], X, n_neighbors=2, y_query=y[queries], y_pool=y
    )

    axes = np.array(fig.axes).reshape(2, 3)
    good, bad = axes[:, 0]
    assert good.get_xlabel() == f"query ({y[right[0]]})"
    assert bad.get_xlabel() == f"query {y[wrong[0]]},\npredicted {predicted[wrong[0]]}"
    for spine in bad.spines.values():
        assert matplotlib.colors.same_color(spine.get_edgecolor(), MISCLASSIFIED_COLOR)
        assert spine.get_linewidth() > 3
    for spine in good.spines.values():
        assert not matplotlib.colors.same_color(
            spine.get_edgecolor(), MISCLASSIFIED_COLOR
        )
    (legend,) = fig.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == [
        "neighbour of the query's class",
        "neighbour of another class",
        "query the estimator misclassifies",
    ]

    # Without mistakes among the queries, the legend names the frames only;
    # mark_misclassified=False never marks.
    fig = plot_nearest_neighbors(
        clf, X[right[:2]], X, n_neighbors=2, y_query=y[right[:2]], y_pool=y
    )
    assert len(fig.legends[0].get_texts()) == 2
    fig = plot_nearest_neighbors(
        clf,
        X[queries],
        X,
        n_neighbors=2,
        y_query=y[queries],
        y_pool=y,
        mark_misclassified=False,
    )
    assert fig.axes[3].get_xlabel() == f"query ({y[wrong[0]]})"
    assert len(fig.legends[0].get_texts()) == 2
    # No labels: no legend.
    assert plot_nearest_neighbors(clf, X[queries], X, n_neighbors=2).legends == []


def test_nearest_neighbors_needs_images(blobs_semi, fast_params, torch_single_thread):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    with pytest.raises(ValueError, match="shows images"):
        plot_nearest_neighbors(clf, X[:2], X[2:20])


def test_nearest_neighbors_checks_n_neighbors(images_fitted):
    clf, X, _ = images_fitted
    with pytest.raises(ValueError, match="n_neighbors"):
        plot_nearest_neighbors(clf, X[:2], X[2:5], n_neighbors=4)
    for bad in (2.5, True, "3", 0):
        with pytest.raises(ValueError, match="n_neighbors must be a positive int"):
            plot_nearest_neighbors(clf, X[:2], X[2:5], n_neighbors=bad)


@pytest.mark.parametrize(
    "labels",
    [{"y_query": slice(0, 1)}, {"y_pool": slice(2, 5)}, {"y_pool": slice(0, 60)}],
)
def test_nearest_neighbors_checks_label_counts(images_fitted, labels):
    clf, X, y = images_fitted
    kwargs = {"y_query": y[:2], "y_pool": y[2:50]}
    kwargs.update({name: y[rows] for name, rows in labels.items()})
    with pytest.raises(ValueError, match="one label per image"):
        plot_nearest_neighbors(clf, X[:2], X[2:50], n_neighbors=3, **kwargs)


def test_unfitted_estimator_is_rejected(digits_images):
    X, y = digits_images
    clf = SemiSupervisedAssociationClassifier()
    with pytest.raises(NotFittedError):
        plot_association_graph(clf, X[:4], y[:4], X[4:8])
    with pytest.raises(NotFittedError):
        plot_nearest_neighbors(clf, X[:2], X[2:8])


def test_missing_matplotlib_is_explained(images_fitted, monkeypatch):
    clf, X, y = images_fitted
    # A None entry in sys.modules makes the import fail, as if not installed.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match="needs matplotlib"):
        plot_association_graph(clf, X[:4], y[:4], X[4:8])


def test_colour_images_become_rgb_thumbnails(labeled_params, torch_single_thread):
    rng = np.random.RandomState(0)
    X = rng.randint(0, 256, size=(40, 3, 8, 8)).astype(np.uint8)
    y = np.repeat([0, 1], 20)
    clf = SemiSupervisedAssociationClassifier(**{**labeled_params, "max_iter": 2})
    clf.fit(X, y)

    fig = plot_association_graph(clf, X[:4], y[:4], X[20:25])
    boxes = [a for a in fig.axes[0].artists if isinstance(a, AnnotationBbox)]
    assert boxes[0].offsetbox.get_data().shape == (8, 8, 3)
    fig = plot_nearest_neighbors(clf, X[:2], X[2:], n_neighbors=3)
    assert fig.axes[1].images[0].get_array().shape == (8, 8, 3)
