"""Which unlabeled samples to label next (``suggest_labels``).

A few-label fit goes wrong where a dense region of the unlabeled samples
holds no labeled one: the network then hands the region to whichever class
its walks reach, confidently, so the classic uncertainty strategies (margin,
entropy) look elsewhere. The suggestion follows low-budget active learning
(TypiClust, Hacohen et al. 2022; ProbCover, Yehuda et al. 2022): cluster the
unlabeled samples' embeddings into as many regions as there will be labels,
take the regions that no labeled sample lies in, and label the most typical
sample (the densest point) of each, so that the picks are spread over
regions rather than n copies of one. The association graph ranks the
regions: one counts by its size, times how much its predicted class
exceeds its expected share (``fit_report_``), over how often the walks from
the labeled samples visit it.
"""

import warnings

import numpy as np
import torch
from sklearn.cluster import KMeans, MiniBatchKMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import _num_samples, column_or_1d

from ._diagnosis import largest_excess
from ._inputs import unlabeled_mask
from ._prior import apply_class_prior

__all__ = ["NO_CLASS", "rank_regions", "suggest_from_embeddings"]

#: Neighbours whose mean distance measures a sample's typicality (TypiClust's).
TYPICALITY_NEIGHBOURS = 20
#: Members of a region that its typicality is measured on, at most.
TYPICALITY_SAMPLES = 2_000
#: Pools larger than this are clustered with mini-batch k-means.
FULL_KMEANS_SAMPLES = 20_000
#: The visit ratio a region's rank divides by is clipped below at this, so
#: that a region no walk reaches does not outrank every other by far.
MIN_VISIT = 0.1
#: Pool samples whose visits are computed at once (a block of 256 anchors by
#: this many samples), so that memory stays bounded whatever the pool's size.
VISIT_CHUNK = 65_536


def _normalised(embeddings):
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
    return embeddings / np.maximum(norms, 1e-12)


def _cluster(points, n_clusters, rng, weights):
    """Regions of the distinct ``points``, each weighted by its copies."""
    kind = KMeans if len(points) <= FULL_KMEANS_SAMPLES else MiniBatchKMeans
    model = kind(n_clusters=n_clusters, n_init=1, random_state=rng)
    with warnings.catch_warnings():
        # Mini-batch k-means can still leave a region empty; empty regions
        # are skipped and the picks topped up from the others
        # (_typical_picks), so its warning says nothing to act on.
        warnings.filterwarnings(
            "ignore", "Number of distinct clusters", ConvergenceWarning
        )
        return model.fit_predict(points, sample_weight=weights), model


def _distinct(points):
    """Where each distinct row of ``points`` first is (in the pool's order,
    so a pool without repeats is clustered as it is), each row's distinct
    row and the copies of each. Rows are compared as strings of bytes, so
    that a large pool sorts in one dimension."""
    rows = np.ascontiguousarray(points)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1])))
    _, first, inverse, counts = np.unique(
        keys.ravel(), return_index=True, return_inverse=True, return_counts=True
    )
    by_position = np.argsort(first)
    rank = np.empty_like(by_position)
    rank[by_position] = np.arange(len(by_position))
    return first[by_position], rank[inverse.ravel()], counts[by_position]


def _visits(pool, anchors):
    """Each pool sample's walk visits from the anchors, 1 = a uniform visit."""
    if len(anchors) == 0:
        return np.ones(len(pool))
    a = torch.as_tensor(anchors, dtype=torch.float32)
    blocks = torch.split(torch.as_tensor(pool, dtype=torch.float32), VISIT_CHUNK)
    visit = torch.zeros(len(pool))
    for rows in torch.split(a, 256):
        if len(blocks) == 1:
            visit += torch.softmax(rows @ blocks[0].T, dim=1).sum(0)
            continue
        # Each anchor's softmax over the whole pool, a block of samples at a
        # time: the normaliser first, then the visits.
        norm = torch.stack([torch.logsumexp(rows @ b.T, 1) for b in blocks], 1)
        norm = torch.logsumexp(norm, 1, keepdim=True)
        visit += torch.cat([torch.exp(rows @ b.T - norm).sum(0) for b in blocks])
    return (visit / len(anchors) * len(pool)).numpy()


def rank_regions(labels, covered, visits, class_ratio):
    """Regions in the order they are labeled: uncovered ones first, then by rank.

    Parameters
    ----------
    labels : ndarray of shape (n_pool,)
        Each pool sample's region.
    covered : ndarray of shape (n_regions,)
        Labeled samples in each region.
    visits : ndarray of shape (n_pool,)
    class_ratio : ndarray of shape (n_pool,)
        Predicted share over expected share of each sample's predicted class.

    Returns
    -------
    order : ndarray of region indices
    """
    n_regions = len(covered)
    size = np.bincount(labels, minlength=n_regions).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        visit = np.bincount(labels, visits, n_regions) / size
        ratio = np.bincount(labels, class_ratio, n_regions) / size
    rank = np.nan_to_num(size * ratio / np.maximum(visit, MIN_VISIT))
    # Fewest labeled samples first (TypiClust), the highest rank among equals.
    order = np.lexsort((-rank, covered))
    return order[size[order] > 0]


def _most_typical(points, members, rng):
    """The member of densest neighbourhood (smallest mean distance to its
    nearest neighbours), measured on a random subset of a large region."""
    if len(members) > TYPICALITY_SAMPLES:
        members = rng.choice(members, TYPICALITY_SAMPLES, replace=False)
    x = torch.as_tensor(points[members])
    distances = torch.cdist(x, x)
    k = min(TYPICALITY_NEIGHBOURS, len(members) - 1)
    if k == 0:
        return int(members[0])
    nearest = distances.topk(k + 1, largest=False).values[:, 1:]
    return int(members[int(nearest.mean(1).argmin())])


def suggest_from_embeddings(
    pool, anchors, class_ratio, n_labels, random_state, focus=None
):
    """Indices of ``n_labels`` pool samples to label, best first.

    Parameters
    ----------
    pool : ndarray of shape (n_pool, dim)
        Embeddings of the unlabeled samples.
    anchors : ndarray of shape (n_anchors, dim)
        Embeddings of the labeled samples (may be empty).
    class_ratio : ndarray of shape (n_pool,)
        Predicted over expected share of each pool sample's predicted class.
    n_labels : int
    random_state : int, RandomState or None
    focus : tuple of two boolean ndarrays, optional
        The pool samples predicted as the class ``fit_report_`` suspects,
        and the anchors labeled with it. The labels then go to the regions
        of that class's predictions (as many regions as its labels and the
        new ones): a style of another class handed to it is a region of its
        predictions that none of its labels lies in. When it has fewer
        predictions than labels asked for, the rest come from the whole
        pool.

    Returns
    -------
    indices : ndarray of int of shape (min(n_labels, n_pool),)
    """
    rng = check_random_state(random_state)
    n_labels = min(n_labels, len(pool))
    if focus is None or not focus[0].any():
        return _region_picks(pool, anchors, class_ratio, n_labels, rng)
    _, row_of, _ = _distinct(_normalised(pool.astype(np.float32)))
    members = np.flatnonzero(focus[0])
    # No more than the class's distinct rows: each distinct sample before
    # any copy of one, over the whole suggestion.
    n_focus = min(n_labels, len(np.unique(row_of[members])))
    picks = members[
        _region_picks(
            pool[members], anchors[focus[1]], class_ratio[members], n_focus, rng
        )
    ].tolist()
    if len(picks) < n_labels:
        # The rest over the whole pool, clustered as an unfocused suggestion
        # would be (enough of them to skip the focus's rows), rows not yet
        # picked first.
        wanted = min(n_labels + len(picks), len(pool))
        rest = _region_picks(pool, anchors, class_ratio, wanted, rng)
        rows, taken = set(row_of[picks].tolist()), set(picks)
        left = [i for i in rest.tolist() if i not in taken]
        fresh = [i for i in left if row_of[i] not in rows]
        picks += (fresh + [i for i in left if row_of[i] in rows])[
            : n_labels - len(picks)
        ]
    return np.asarray(picks, dtype=np.intp)


def _region_picks(pool, anchors, class_ratio, n_labels, rng):
    """The TypiClust picks of :func:`suggest_from_embeddings` in ``pool``."""
    points = _normalised(pool.astype(np.float32))
    # Clustered once per distinct row, weighted by its copies: a pool of
    # repeated rows has fewer distinct points than regions otherwise.
    first, distinct_of, copies = _distinct(points)
    n_regions = min(len(first), len(anchors) + n_labels)
    regions, model = _cluster(points[first], n_regions, rng, copies)
    labels = regions[distinct_of]
    covered = np.zeros(n_regions, dtype=int)
    if len(anchors):
        covered = np.bincount(
            model.predict(_normalised(anchors.astype(np.float32))),
            minlength=n_regions,
        )
    visits = _visits(pool, anchors)
    order = rank_regions(labels, covered, visits, class_ratio)
    picks = _typical_picks(points, labels, distinct_of, order, n_labels, rng)
    return np.asarray(picks, dtype=np.intp)


def _typical_picks(points, labels, distinct_of, order, n_labels, rng):
    """The most typical sample of each region in ``order``, then again among
    the samples left, until there are ``n_labels`` (regions can be fewer
    than labels). No row is picked twice, in copies, while another distinct
    row is left."""
    members = np.split(
        np.argsort(labels, kind="stable"), np.cumsum(np.bincount(labels))[:-1]
    )
    picks, taken = [], np.zeros(len(points), dtype=bool)
    row_taken = np.zeros(distinct_of.max() + 1, dtype=bool)
    rotation = list(order)
    # Every sample at most once: no more picks than samples, whatever asked.
    n_labels = min(n_labels, len(points))
    while len(picks) < n_labels:
        fresh_only = not row_taken.all()
        for region in rotation:
            left = members[region][~taken[members[region]]]
            if fresh_only:
                left = left[~row_taken[distinct_of[left]]]
            if len(left):
                picks.append(_most_typical(points, left, rng))
                taken[picks[-1]] = row_taken[distinct_of[picks[-1]]] = True
            if len(picks) == n_labels:
                break
        # Regions whose samples are all picked leave the rotation.
        rotation = [r for r in rotation if not taken[members[r]].all()]
    return picks


def _class_ratios(report, classes):
    """Predicted over expected share per class (1 without a report or
    expected shares)."""
    if report is None or not report.expected_shares:
        return np.ones(len(classes))
    return np.array(
        [
            report.predicted_shares[c] / report.expected_shares[c]
            for c in classes.tolist()
        ]
    )


def _suspect_class(report, classes):
    """Index of the class a suspect report names."""
    labels = classes.tolist()
    return largest_excess(
        [report.predicted_shares[c] for c in labels],
        [report.expected_shares[c] for c in labels],
    )


#: The label of a labeled sample whose class is not known (a modAL learner
#: without ``y_training``): it marks a covered region, and no class.
NO_CLASS = object()


def _labels_and_pool(y, n_samples):
    """``y`` (as in fit, or None) as a 1-D array, and where it marks the
    samples to choose among (all of them without ``y``)."""
    if y is None:
        return None, np.ones(n_samples, dtype=bool)
    # A column vector, as fit takes it (with the same warning).
    y = column_or_1d(y, warn=True)
    if len(y) != n_samples:
        raise ValueError(
            f"y has {len(y)} labels for {n_samples} samples of X; pass y as in "
            "fit (-1 for each unlabeled sample), or no y."
        )
    return y, unlabeled_mask(y)


def _check_known_labels(y, unlabeled, classes):
    """Refuse labels that are no class of the fit: their regions would not
    count as covered by their class (a string "1" is not the class 1)."""
    known = set(classes.tolist())
    unknown = [
        label
        for label in dict.fromkeys(y[~unlabeled].tolist())
        if label is not NO_CLASS and label not in known
    ]
    if unknown:
        raise ValueError(
            f"y holds labels that are not classes of the fit: {unknown[:5]!r} "
            f"(the classes are {classes.tolist()[:10]!r}). Pass y as in fit, "
            "with the same label type (-1 for each unlabeled sample)."
        )


def suggest_labels(estimator, X, n_labels, y, random_state):
    """``estimator.suggest_labels``: see there."""
    n_samples = _num_samples(X)
    if n_samples == 0:
        raise ValueError("X holds no sample: there is nothing to suggest.")
    y, unlabeled = _labels_and_pool(y, n_samples)
    if y is not None:
        # Before the pass over X: a wrong y fails at once.
        _check_known_labels(y, unlabeled, estimator.classes_)
    candidates = np.flatnonzero(unlabeled)
    if len(candidates) == 0:
        raise ValueError(
            "There is no unlabeled sample to suggest: every sample of X is "
            "labeled in y (mark the unlabeled ones -1)."
        )
    # One pass over X with one fitted state: a refit in another thread
    # cannot mix two models into one suggestion.
    state, embeddings = estimator._forward(X, "embedding")
    pool, anchors = embeddings[unlabeled], embeddings[~unlabeled]
    logits = state.model.logits
    with torch.no_grad():
        scores = torch.as_tensor(pool) @ logits.weight.detach().float().cpu().T
    proba = torch.softmax(scores + logits.bias.detach().float().cpu(), 1).numpy()
    if not isinstance(estimator.class_prior, str):
        # Given frequencies weigh the predictions, as in the report that
        # counted them (and in predict).
        proba = apply_class_prior(proba, state.class_prior)
    predicted = proba.argmax(1)
    class_ratios = _class_ratios(state.fit_report, state.classes)
    focus = None
    if state.fit_report is not None and state.fit_report.verdict == "suspect":
        suspect = _suspect_class(state.fit_report, state.classes)
        labeled_as_suspect = np.zeros(len(anchors), dtype=bool)
        if y is not None:
            labeled_as_suspect = y[~unlabeled] == state.classes[suspect]
        focus = (predicted == suspect, labeled_as_suspect)
    picks = suggest_from_embeddings(
        pool, anchors, class_ratios[predicted], n_labels, random_state, focus
    )
    return candidates[picks]
