"""Pictures of what a fitted association classifier has learned.

:func:`plot_association_graph` draws the walk of the paper's Figure 3 (labeled
batch -> unlabeled batch -> labeled batch) and :func:`plot_nearest_neighbors`
the nearest neighbours in embedding space of the paper's STL-10 figure.

matplotlib is not a dependency of skassoc; these functions import it when
they are called.
"""

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from ._engine._losses import association_matrices
from ._utils import is_integer

__all__ = ["plot_association_graph", "plot_nearest_neighbors"]

# The colours of the paper's Figure 3: green for the labeled batch A, red
# for the unlabeled batch B.
LABELED_COLOR = "tab:green"
UNLABELED_COLOR = "tab:red"
# The frame of a query image that the estimator misclassifies.
MISCLASSIFIED_COLOR = "red"


def _import_matplotlib():
    try:
        import matplotlib
        import matplotlib.pyplot  # noqa: F401  (makes matplotlib.pyplot usable)
    except ImportError as exc:
        raise ImportError(
            "skassoc.plotting needs matplotlib, which is not installed. Install "
            "it with `pip install matplotlib` (or `pip install skassoc[examples]`)."
        ) from exc
    return matplotlib


def _positive_int(value, name):
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}.")
    return int(value)


def _image_shape(X, estimator, image_shape):
    """``(c, h, w)`` of one image of ``X``, or None when ``X`` holds feature rows.

    The shape comes from ``image_shape``, else from ``X`` when it is an image
    batch, else from the estimator's ``input_shape_`` (flat rows of images).
    """
    if image_shape is not None:
        shape = tuple(int(v) for v in image_shape)
    elif np.ndim(X) in (3, 4):
        shape = np.shape(X)[1:]
    else:
        shape = getattr(estimator, "input_shape_", None)
    if shape is None:
        return None
    shape = tuple(shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise ValueError(
            "Thumbnails need grey or RGB images of shape (h, w), (1, h, w) or "
            f"(3, h, w); got {shape}."
        )
    return shape


def _thumbnails(X, shape):
    """Images of ``shape`` (c, h, w) scaled to [0, 1], laid out for ``imshow``.

    Grey images are returned as ``(n, h, w)``, colour images as ``(n, h, w, c)``.
    """
    X = np.asarray(X)
    images = X.reshape(X.shape[0], *shape).astype(np.float64)
    # One scale for all thumbnails, so that faint and strong strokes stay
    # comparable; raw pixels can be 0..16 (digits), 0..255 (MNIST) or floats.
    low, high = (images.min(), images.max()) if images.size else (0.0, 1.0)
    images = (images - low) / (high - low if high > low else 1.0)
    if shape[0] == 1:
        return images[:, 0]
    return images.transpose(0, 2, 3, 1)


def _embed(estimator, X):
    """The embeddings of ``X`` as passed, checked as ``transform`` checks it.

    Callers embed before converting ``X`` to an array: that would drop a
    DataFrame's column names, and columns in another order than in ``fit``,
    which ``transform`` refuses, would be drawn with a mere warning.
    """
    return torch.as_tensor(np.asarray(estimator.transform(X), dtype=np.float64))


def _add_thumbnail(ax, image, xy, zoom, color, linewidth):
    from matplotlib.colors import Normalize
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    thumbnail = OffsetImage(image, zoom=zoom, cmap="gray_r", norm=Normalize(0, 1))
    box = AnnotationBbox(
        thumbnail,
        xy,
        pad=0.1,
        frameon=True,
        bboxprops={"edgecolor": color, "linewidth": linewidth},
        zorder=3,
    )
    ax.add_artist(box)
    return box


def _line_collection(starts, ends, probabilities, max_lines):
    """Lines from ``starts[i]`` to ``ends[j]``, opaque as ``probabilities[i, j]``."""
    from matplotlib.collections import LineCollection

    i, j = np.unravel_index(np.arange(probabilities.size), probabilities.shape)
    p = probabilities.ravel()
    if max_lines is not None and max_lines < p.size:
        keep = np.argsort(-p, kind="stable")[:max_lines]
        i, j, p = i[keep], j[keep], p[keep]
    # Draw the faint lines first, so that the strong ones stay on top.
    order = np.argsort(p, kind="stable")
    i, j, p = i[order], j[order], p[order]
    segments = np.stack([starts[i], ends[j]], axis=1)
    colors = np.zeros((p.size, 4))
    colors[:, 3] = np.clip(p, 0.0, 1.0)
    return LineCollection(segments, colors=colors, linewidths=1.0, zorder=1)


def plot_association_graph(
    estimator,
    X_labeled,
    y_labeled,
    X_unlabeled,
    *,
    ax=None,
    max_lines=None,
    sort_unlabeled=True,
    show_images=True,
    image_shape=None,
):
    """Draw the walk from labeled to unlabeled samples and back (the paper's Fig. 3).

    The labeled samples ``A`` form the top row, the unlabeled samples ``B``
    the middle row and ``A`` again the bottom row. A line from ``A[i]`` to
    ``B[j]`` is as opaque as the transition probability ``P_ab[i, j]``, a line
    from ``B[j]`` back to ``A[i]`` as ``P_ba[j, i]``, both computed from the
    embeddings of the fitted network as in training. After good training
    the walk from every labeled sample leads to unlabeled samples of its class
    and back.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        A fitted estimator (fit with ``max_iter=1`` to see the associations
        of an untrained network).
    X_labeled : array-like of shape (n_labeled, ...)
        The labeled batch ``A``, in the form ``estimator`` takes.
    y_labeled : array-like of shape (n_labeled,)
        Classes of ``X_labeled``. The samples are shown sorted by class.
    X_unlabeled : array-like of shape (n_unlabeled, ...)
        The unlabeled batch ``B``.
    ax : matplotlib.axes.Axes, default=None
        Axes to draw on; a new figure when None.
    max_lines : int, default=None
        Draw only the ``max_lines`` most probable lines of each step (A to B
        and B to A); None draws all ``2 * n_labeled * n_unlabeled``.
    sort_unlabeled : bool, default=True
        Order ``B`` by the class whose labeled samples visit it most (which
        needs no labels of ``B``), so that consistent associations show as
        bundles of lines between blocks of one class. False keeps the order
        of ``X_unlabeled``.
    show_images : bool, default=True
        Show the samples as thumbnails when they are images; otherwise (and
        for feature vectors) as markers, labeled samples with their class.
    image_shape : tuple of int, default=None
        ``(h, w)`` or ``(c, h, w)`` of one image. By default it is taken from
        ``X_labeled`` when it holds images, else from
        ``estimator.input_shape_``.

    Returns
    -------
    fig : matplotlib.figure.Figure
        The figure holding the drawing. Its x-axis label gives the
        probability that a round trip ``A -> B -> A`` ends in the class where
        it started, the quantity the walker loss drives up.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        If ``estimator`` is not fitted.

    See Also
    --------
    plot_nearest_neighbors : Nearest neighbours in the embedding.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import load_digits
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc.datasets import make_semi_supervised_labels
    >>> from skassoc.plotting import plot_association_graph
    >>> X, y = load_digits(return_X_y=True)
    >>> X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)
    >>> y_semi = make_semi_supervised_labels(y, 10, random_state=0)
    >>> clf = SemiSupervisedAssociationClassifier(max_iter=20, device="cpu",
    ...                                           random_state=0).fit(X, y_semi)
    >>> fig = plot_association_graph(clf, X[:10], y[:10], X[10:20])
    >>> len(fig.axes)
    1
    """
    check_is_fitted(estimator)
    matplotlib = _import_matplotlib()
    plt = matplotlib.pyplot
    if max_lines is not None:
        max_lines = _positive_int(max_lines, "max_lines")

    y_labeled = _check_labels(y_labeled, X_labeled)
    embedded = [_embed(estimator, X) for X in (X_labeled, X_unlabeled)]
    # Sorting A by class makes a good association visible as lines that run
    # between blocks of the same class.
    order = np.argsort(y_labeled, kind="stable")
    X_labeled = np.asarray(X_labeled)[order]
    y_labeled = y_labeled[order]
    X_unlabeled = np.asarray(X_unlabeled)

    p_ab, p_ba, p_aba = association_matrices(embedded[0][order], embedded[1])
    p_ab, p_ba, p_aba = p_ab.numpy(), p_ba.numpy(), p_aba.numpy()
    n_labeled, n_unlabeled = p_ab.shape
    if sort_unlabeled:
        unlabeled_order = _by_visits(p_ab, y_labeled)
        X_unlabeled = X_unlabeled[unlabeled_order]
        p_ab = p_ab[:, unlabeled_order]
        p_ba = p_ba[unlabeled_order]

    width = max(n_labeled, n_unlabeled)
    if ax is None:
        fig_width = min(max(6.0, 0.4 * width + 1.2), 20.0)
        fig, ax = plt.subplots(figsize=(fig_width, 3.6))
        # About an inch on the left for the row labels ("unlabeled B").
        fig.subplots_adjust(left=1.05 / fig_width, right=0.98, top=0.97, bottom=0.1)
    # The figure of a subfigure's axes is the subfigure, whose own ``figure``
    # is the root one (a Figure's is itself): sizes and the result are those
    # of the root figure.
    fig = ax.figure.figure

    # Rows from the top, as in the paper: A, B, then A again ("round trip").
    rows = [
        np.column_stack([(np.arange(n) + 0.5) / n, np.full(n, height)])
        for n, height in ((n_labeled, 2.0), (n_unlabeled, 1.0), (n_labeled, 0.0))
    ]
    ax.add_collection(_line_collection(rows[0], rows[1], p_ab, max_lines))
    ax.add_collection(_line_collection(rows[1], rows[2], p_ba, max_lines))
    shape = _image_shape(X_labeled, estimator, image_shape) if show_images else None
    if shape is not None:
        _draw_thumbnails(ax, fig, (X_labeled, X_unlabeled), shape, rows, width)
    else:
        _draw_markers(ax, rows, y_labeled)
    same_class = y_labeled[:, None] == y_labeled[None, :]
    _style_rows(ax, float((p_aba * same_class).sum(axis=1).mean()))
    return fig


def _check_labels(y_labeled, X_labeled):
    y_labeled = np.asarray(y_labeled)
    if y_labeled.ndim != 1:
        raise ValueError(
            f"y_labeled must be 1-D (one class per sample); got shape "
            f"{y_labeled.shape}."
        )
    if y_labeled.shape[0] != len(X_labeled):
        raise ValueError(
            f"y_labeled has {y_labeled.shape[0]} labels for {len(X_labeled)} "
            "labeled samples."
        )
    return y_labeled


def _by_visits(p_ab, y_labeled):
    """Unlabeled samples grouped by the class that visits them most.

    Within a class, the most visited samples first.
    """
    classes, class_of_labeled = np.unique(y_labeled, return_inverse=True)
    visits = np.zeros((len(classes), p_ab.shape[1]))
    np.add.at(visits, class_of_labeled, p_ab)
    return np.lexsort((-visits.max(axis=0), visits.argmax(axis=0)))


def _draw_thumbnails(ax, fig, inputs, shape, rows, width):
    """The samples of the three rows as framed thumbnails."""
    X_labeled, X_unlabeled = inputs
    flat = [X.reshape(len(X), -1) for X in inputs]
    images = _thumbnails(np.concatenate(flat), shape)
    # Fit the thumbnails to the slot of one sample in the widest row and
    # to a third of the height between two rows (sizes in points; the
    # axes' extent in pixels also holds inside a subfigure).
    box = ax.get_window_extent()
    slot = box.width / fig.dpi * 72 / width
    row_gap = box.height / fig.dpi * 72 / 3.2
    zoom = min(0.7 * slot, 0.6 * row_gap) / max(images.shape[1:3])
    labeled, unlabeled = images[: len(X_labeled)], images[len(X_labeled) :]
    for row, row_images, color in zip(
        rows,
        (labeled, unlabeled, labeled),
        (LABELED_COLOR, UNLABELED_COLOR, LABELED_COLOR),
        strict=True,
    ):
        for image, xy in zip(row_images, row, strict=True):
            _add_thumbnail(ax, image, xy, zoom, color, 1.5)


def _draw_markers(ax, rows, y_labeled):
    """The samples of the three rows as dots, the labeled ones with their class."""
    marker = {"s": 60, "zorder": 3, "edgecolors": "black", "linewidths": 0.5}
    for row, color in zip(rows, (LABELED_COLOR, UNLABELED_COLOR, LABELED_COLOR)):
        ax.scatter(*row.T, color=color, **marker)
    for label, (x, y) in zip(y_labeled, rows[0], strict=True):
        ax.annotate(
            str(label),
            (x, y),
            xytext=(0, 8),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
        )


def _style_rows(ax, round_trip):
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.45, 2.45)
    ax.set_yticks([2.0, 1.0, 0.0], ["labeled A", "unlabeled B", "labeled A"])
    ax.set_xticks([])
    ax.set_xlabel(
        f"Round trips A \u2192 B \u2192 A ending in their class: {round_trip:.0%}"
    )
    for spine in ax.spines.values():
        spine.set_visible(False)


def plot_nearest_neighbors(
    estimator,
    X_query,
    X_pool,
    *,
    n_neighbors=5,
    y_query=None,
    y_pool=None,
    image_shape=None,
    mark_misclassified=True,
):
    """Show the pool images closest to each query image in embedding space.

    Every row shows a query image and its ``n_neighbors`` nearest pool images
    by cosine similarity of the estimator's embeddings, most similar first,
    with the similarity under each thumbnail (as in the paper's STL-10
    figure). With labels, a legend explains the frames, and the queries that
    the estimator misclassifies get a thick red frame and their predicted
    class.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        A fitted estimator.
    X_query : array-like of shape (n_queries, ...)
        Query images, in the form ``estimator`` takes.
    X_pool : array-like of shape (n_pool, ...)
        Images to search. A query that is also in the pool finds itself
        first, with similarity 1.
    n_neighbors : int, default=5
        Neighbours shown per query.
    y_query, y_pool : array-like of shape (n_queries,) and (n_pool,), \
            default=None
        Classes of the images. When both are given, each neighbour is framed
        green if it has its query's class and red otherwise.
    image_shape : tuple of int, default=None
        ``(h, w)`` or ``(c, h, w)`` of one image. By default it is taken from
        ``X_query`` when it holds images, else from ``estimator.input_shape_``.
    mark_misclassified : bool, default=True
        When ``y_query`` is given, frame every query whose
        ``estimator.predict`` differs from its label in thick red and name
        the predicted class under it ("query 3, predicted 8").

    Returns
    -------
    fig : matplotlib.figure.Figure
        A figure with one row of ``1 + n_neighbors`` axes per query.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        If ``estimator`` is not fitted.
    ValueError
        If the inputs are not images or ``n_neighbors`` exceeds the pool.

    See Also
    --------
    plot_association_graph : The walk between labeled and unlabeled samples.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import load_digits
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc.datasets import make_semi_supervised_labels
    >>> from skassoc.plotting import plot_nearest_neighbors
    >>> X, y = load_digits(return_X_y=True)
    >>> X = (X * 15).astype(np.uint8).reshape(-1, 8, 8)
    >>> y_semi = make_semi_supervised_labels(y, 10, random_state=0)
    >>> clf = SemiSupervisedAssociationClassifier(max_iter=20, device="cpu",
    ...                                           random_state=0).fit(X, y_semi)
    >>> fig = plot_nearest_neighbors(clf, X[:2], X[2:200], n_neighbors=3)
    >>> len(fig.axes)
    8
    """
    check_is_fitted(estimator)
    matplotlib = _import_matplotlib()
    plt = matplotlib.pyplot

    passed = (X_query, X_pool)
    X_query, X_pool = np.asarray(X_query), np.asarray(X_pool)
    n_neighbors, shape = _check_neighbor_inputs(
        estimator, X_query, X_pool, y_query, y_pool, n_neighbors, image_shape
    )

    similarity, nearest = _nearest(estimator, *passed, n_neighbors)

    # Scale only the images shown (the pool can be large), all on one scale so
    # that queries and neighbours compare.
    n_queries = len(X_query)
    shown_pool = X_pool[nearest.ravel()]
    shown = [X_query.reshape(n_queries, -1), shown_pool.reshape(len(shown_pool), -1)]
    images = _thumbnails(np.concatenate(shown), shape)
    query_images = images[:n_queries]
    neighbour_images = images[n_queries:].reshape(
        n_queries, n_neighbors, *images.shape[1:]
    )
    check_labels = y_query is not None and y_pool is not None
    if check_labels:
        y_query, y_pool = np.asarray(y_query), np.asarray(y_pool)
    misclassified = np.zeros(n_queries, dtype=bool)
    if mark_misclassified and y_query is not None:
        y_query = np.asarray(y_query)
        predicted = np.asarray(estimator.predict(passed[0]))
        misclassified = predicted != y_query

    fig, axes = plt.subplots(
        n_queries,
        n_neighbors + 1,
        figsize=(1.1 * (n_neighbors + 1), 1.3 * n_queries + 0.4),
        squeeze=False,
        layout="constrained",
    )
    cmap = "gray_r" if query_images.ndim == 3 else None
    for row, neighbours in enumerate(nearest):
        label = "query"
        if misclassified[row]:
            label = f"query {y_query[row]},\npredicted {predicted[row]}"
        elif y_query is not None:
            label = f"query ({y_query[row]})"
        _show(axes[row, 0], query_images[row], cmap, label, misclassified[row])
        for column, index in enumerate(neighbours, start=1):
            ax = axes[row, column]
            ax.imshow(neighbour_images[row, column - 1], cmap=cmap, vmin=0, vmax=1)
            ax.set_xlabel(f"{similarity[row, index]:.3f}")
            if check_labels:
                same = y_pool[index] == y_query[row]
                _frame(ax, LABELED_COLOR if same else UNLABELED_COLOR, 2.5)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    _neighbour_legend(fig, check_labels, misclassified.any())
    return fig


def _nearest(estimator, X_query, X_pool, n_neighbors):
    """The cosine similarities of the queries' embeddings to the pool's, of
    shape (n_queries, n_pool), and the indices of each query's
    ``n_neighbors`` most similar pool inputs, most similar first (ties in
    pool order)."""
    query, pool = (
        torch.nn.functional.normalize(_embed(estimator, X), dim=1)
        for X in (X_query, X_pool)
    )
    similarity = (query @ pool.T).numpy()
    nearest = np.argsort(-similarity, axis=1, kind="stable")[:, :n_neighbors]
    return similarity, nearest


def _check_neighbor_inputs(
    estimator, X_query, X_pool, y_query, y_pool, n_neighbors, image_shape
):
    """``n_neighbors`` checked and the image shape, or a clear ValueError."""
    n_neighbors = _positive_int(n_neighbors, "n_neighbors")
    for name, labels, X in (("y_query", y_query, X_query), ("y_pool", y_pool, X_pool)):
        if labels is not None and np.shape(labels) != (len(X),):
            raise ValueError(
                f"{name} must hold one label per image ({len(X)}); got shape "
                f"{np.shape(labels)}."
            )
    if not 1 <= n_neighbors <= len(X_pool):
        raise ValueError(
            f"n_neighbors must be between 1 and the pool size {len(X_pool)}; "
            f"got {n_neighbors}."
        )
    shape = _image_shape(X_query, estimator, image_shape)
    if shape is None:
        raise ValueError(
            "plot_nearest_neighbors shows images: pass X_query as (n, h, w) or "
            "(n, c, h, w) images, or set image_shape."
        )
    return n_neighbors, shape


def _show(ax, image, cmap, label, misclassified):
    """A query image; its frame separates it from its neighbours."""
    ax.imshow(image, cmap=cmap, vmin=0, vmax=1)
    if misclassified:
        ax.set_xlabel(label, color=MISCLASSIFIED_COLOR)
        _frame(ax, MISCLASSIFIED_COLOR, 4.0)
    else:
        ax.set_xlabel(label)
        _frame(ax, None, 2.0)


def _frame(ax, color, linewidth):
    for spine in ax.spines.values():
        if color is not None:
            spine.set_edgecolor(color)
        spine.set_linewidth(linewidth)


def _neighbour_legend(fig, check_labels, any_misclassified):
    handles = []
    if check_labels:
        handles += [
            _frame_handle(LABELED_COLOR, 2.5, "neighbour of the query's class"),
            _frame_handle(UNLABELED_COLOR, 2.5, "neighbour of another class"),
        ]
    if any_misclassified:
        handles.append(
            _frame_handle(MISCLASSIFIED_COLOR, 4.0, "query the estimator misclassifies")
        )
    if handles:
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncols=min(len(handles), 2),
            frameon=False,
            fontsize="small",
        )


def _frame_handle(color, linewidth, label):
    """A legend entry that looks like a thumbnail's frame."""
    from matplotlib.patches import Patch

    return Patch(facecolor="none", edgecolor=color, linewidth=linewidth, label=label)
