"""Active learning: which samples to label next, as modAL query strategies.

modAL's ``ActiveLearner`` calls its query strategy as
``query_strategy(learner, X_pool, n_instances)`` and labels the samples of
the indices it returns; :func:`association_sampling` is such a strategy. It
works with a fitted :class:`~skassoc.SemiSupervisedAssociationClassifier`
given directly, too (modAL need not be installed).
"""

import numpy as np
import scipy.sparse as sp
from sklearn.utils import _safe_indexing
from sklearn.utils.validation import _num_samples, column_or_1d

from ._inputs import unlabeled_mask
from ._suggest import NO_CLASS

__all__ = ["association_sampling"]


def association_sampling(classifier, X_pool, n_instances=1, *, random_state=None):
    """Pool samples to label next, from the association graph.

    Parameters
    ----------
    classifier : SemiSupervisedAssociationClassifier or modAL learner
        A fitted estimator, or a modAL ``ActiveLearner`` around one (its
        ``estimator``); the rows of a learner's ``X_training`` whose
        ``y_training`` is not ``-1`` mark the regions that labels already
        cover.
    X_pool : array-like or sparse matrix of shape (n_pool, ...)
        The unlabeled samples to choose from, of the form the estimator
        was fitted on.
    n_instances : int, default=1
        How many to choose.
    random_state : int, RandomState instance or None, default=None
        Seeds the clustering.

    Returns
    -------
    indices : ndarray of int
        Indices into ``X_pool``, in the order to label them (for this
        ``n_instances``: the regions depend on it).

    See Also
    --------
    skassoc.SemiSupervisedAssociationClassifier.suggest_labels : How they are
        chosen.

    Examples
    --------
    With modAL installed (``clf`` fitted on ``X_labeled`` and the pool)::

        from modAL.models import ActiveLearner

        learner = ActiveLearner(
            estimator=clf,
            query_strategy=association_sampling,
            X_training=X_labeled,
            y_training=y_labeled,
        )
        indices, samples = learner.query(X_pool, n_instances=10)
    """
    estimator = getattr(classifier, "estimator", classifier)
    labeled = getattr(classifier, "X_training", None)
    if labeled is None or _num_samples(labeled) == 0:
        return estimator.suggest_labels(X_pool, n_instances, random_state=random_state)
    y_training = getattr(classifier, "y_training", None)
    labels = None
    if sp.issparse(labeled):
        labeled = sp.csr_matrix(labeled)  # rows can be picked (not from COO)
    if y_training is not None:
        # A semi-supervised learner's training set may hold -1 rows too.
        y_training = column_or_1d(y_training, warn=True)
        if len(y_training) != _num_samples(labeled):
            raise ValueError(
                f"The learner's y_training has {len(y_training)} labels for "
                f"{_num_samples(labeled)} rows of X_training; give one label "
                "(or -1) per row."
            )
        known = np.flatnonzero(~unlabeled_mask(y_training))
        labeled = _safe_indexing(labeled, known)
        labels = y_training[known]
    n_labeled = _num_samples(labeled)
    X = _stack_rows(labeled, X_pool)
    # The -1 marks tell the pool from the labeled samples; the labels tell
    # which of these a suspect class already has (a learner without
    # y_training: a marker equal to no class).
    y = np.full(n_labeled + _num_samples(X_pool), -1, dtype=object)
    y[:n_labeled] = NO_CLASS if labels is None else labels
    picks = estimator.suggest_labels(X, n_instances, y=y, random_state=random_state)
    return picks - n_labeled


def _stack_rows(first, second):
    """The rows of ``first`` then ``second``, in ``second``'s form: sparse
    rows stay sparse, and a pandas DataFrame keeps its column names in its
    own order (the estimator checks them against those it was fitted with).
    """
    if sp.issparse(second):
        return sp.vstack([sp.csr_matrix(first), second], format="csr")
    if sp.issparse(first):
        first = first.toarray()  # labeled samples: few
    if hasattr(second, "iloc") and hasattr(second, "columns"):
        import pandas as pd  # a DataFrame pool: pandas is installed

        if not hasattr(first, "columns"):
            first = pd.DataFrame(np.asarray(first), columns=second.columns)
        elif set(first.columns) != set(second.columns):
            raise ValueError(
                "The learner's X_training and X_pool have different columns: "
                f"{sorted(map(str, set(first.columns) ^ set(second.columns)))} "
                "are in one only. Give both the columns the estimator was "
                "fitted on."
            )
        return pd.concat([first[list(second.columns)], second], ignore_index=True)
    return np.concatenate([np.asarray(first), np.asarray(second)])
