"""Cross-validation and scoring when ``y`` marks unlabeled samples with ``-1``.

scikit-learn's splitters and scorers treat ``-1`` as one more class: a test
fold is then mostly unlabeled samples, every prediction on them counts as an
error, and probability scorers return NaN. The splitters here split the
*labeled* samples into folds and add every unlabeled sample to every training
fold, so that test folds hold labeled samples only; they work as ``cv`` in
:func:`~sklearn.model_selection.cross_validate`,
:class:`~sklearn.model_selection.GridSearchCV` and the other searches.
:func:`labeled_scorer` makes scorers that skip unlabeled samples, for folds
that may hold some (a ``cv`` of your own).

The test folds leave the unlabeled samples out, so they are no partition of
the samples: :func:`~sklearn.model_selection.cross_val_predict` refuses them.
Unlabeled samples are found as the estimator finds them: ``-1``, or the
string ``"-1"`` in string arrays (see the user guide's section on labels).
"""

import numbers
import time
from abc import abstractmethod
from inspect import signature

import numpy as np
from scipy.stats import rankdata
from sklearn.base import BaseEstimator, MetaEstimatorMixin, _fit_context, clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import check_scoring
from sklearn.model_selection import (
    BaseCrossValidator,
    KFold,
    ParameterGrid,
    RepeatedKFold,
    RepeatedStratifiedKFold,
    StratifiedKFold,
    check_cv,
)
from sklearn.utils import _safe_indexing, check_random_state, indexable
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.metadata_routing import MetadataRequest
from sklearn.utils.parallel import Parallel, delayed
from sklearn.utils.validation import _num_samples, column_or_1d

from ._fitted import is_fitted
from ._inputs import unlabeled_mask
from ._run_store import RunStore
from ._settings import fit_seed
from ._stacked import STACKINGS, check_candidate_params, fit_candidates

__all__ = [
    "SemiSupervisedKFold",
    "SemiSupervisedStratifiedKFold",
    "RepeatedSemiSupervisedKFold",
    "RepeatedSemiSupervisedStratifiedKFold",
    "labeled_scorer",
    "StackedGridSearchCV",
    "RunStore",
]


def _labeled_and_unlabeled(y):
    """``y`` as a 1-D array, the indices of its labeled and unlabeled samples."""
    if y is None:
        raise ValueError(
            "The semi-supervised splitters need y to tell labeled samples from "
            "unlabeled ones (-1); got y=None."
        )
    y = column_or_1d(np.asarray(y))
    unlabeled = unlabeled_mask(y)
    if unlabeled.all():
        raise ValueError(
            "y holds no labeled samples (every label is -1); test folds are "
            "made of labeled samples only."
        )
    return y, np.flatnonzero(~unlabeled), np.flatnonzero(unlabeled)


class _SemiSupervisedSplitter(BaseCrossValidator):
    """Split the labeled samples with a scikit-learn splitter; train on all others.

    Subclasses say which splitter in :meth:`_labeled_cv`.
    """

    def _check_params(self):
        # Building the wrapped splitter runs scikit-learn's checks of the
        # parameters, so a bad n_splits fails here as it would in KFold.
        self._labeled_cv()

    @abstractmethod
    def _labeled_cv(self):
        """The scikit-learn splitter that splits the labeled samples."""

    def _check_labeled(self, y_labeled):
        """Refuse labeled samples too few for the folds (see subclasses)."""
        if y_labeled.shape[0] < self.n_splits:
            raise ValueError(
                f"n_splits={self.n_splits} is more than the "
                f"{y_labeled.shape[0]} labeled samples in y; test folds hold "
                "labeled samples only."
            )

    def split(self, X, y, groups=None):
        """Generate indices to split data into training and test set.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...)
            Training data; only its number of samples is used.
        y : array-like of shape (n_samples,)
            Labels, ``-1`` for unlabeled samples.
        groups : object
            Always ignored, exists for compatibility.

        Yields
        ------
        train : ndarray
            Sorted training indices: the labeled samples of the other folds
            and every unlabeled sample.
        test : ndarray
            Testing indices, labeled samples only.
        """
        X, y, groups = indexable(X, y, groups)
        y, labeled, unlabeled = _labeled_and_unlabeled(y)
        y_labeled = y[labeled]
        self._check_labeled(y_labeled)
        # The wrapped splitter sees the labeled samples alone; its indices
        # point into `labeled`.
        for train, test in self._labeled_cv().split(labeled, y_labeled):
            yield np.sort(np.concatenate([labeled[train], unlabeled])), labeled[test]

    def get_n_splits(self, X=None, y=None, groups=None):
        """Return the number of splitting iterations of the cross-validator.

        Parameters
        ----------
        X, y, groups : object
            Always ignored, exist for compatibility.

        Returns
        -------
        n_splits : int
            Number of (train, test) pairs that :meth:`split` yields.
        """
        return self._labeled_cv().get_n_splits()


class _KFoldSplitter(_SemiSupervisedSplitter):
    """K folds of the labeled samples, by the scikit-learn class ``_labeled``."""

    _labeled = KFold

    def __init__(self, n_splits=5, *, shuffle=False, random_state=None):
        self.n_splits = n_splits
        self.shuffle = shuffle
        self.random_state = random_state
        self._check_params()

    def _labeled_cv(self):
        return self._labeled(
            self.n_splits, shuffle=self.shuffle, random_state=self.random_state
        )


class _RepeatedSplitter(_SemiSupervisedSplitter):
    """Repeated K folds of the labeled samples, by the class ``_labeled``."""

    _labeled = RepeatedKFold

    def __init__(self, *, n_splits=5, n_repeats=10, random_state=None):
        self.n_splits = n_splits
        self.n_repeats = n_repeats
        self.random_state = random_state
        self._check_params()

    def _labeled_cv(self):
        return self._labeled(
            n_splits=self.n_splits,
            n_repeats=self.n_repeats,
            random_state=self.random_state,
        )


class _StratifiedCheck:
    """Refuse a class with fewer labeled samples than folds."""

    def _check_labeled(self, y_labeled):
        classes, counts = np.unique(y_labeled, return_counts=True)
        if counts.min() < self.n_splits:
            rare = classes[counts < self.n_splits]
            raise ValueError(
                f"Every class needs at least n_splits={self.n_splits} labeled "
                f"samples, one in each test fold; class {rare.tolist()[0]!r} has "
                f"{counts[counts < self.n_splits][0]}. Lower n_splits or label "
                "more samples."
            )


class SemiSupervisedKFold(_KFoldSplitter):
    """K-fold over the labeled samples; every training fold keeps the unlabeled.

    The labeled samples (``y != -1``) are split as
    :class:`~sklearn.model_selection.KFold` would split them alone; each
    test fold is one of these folds, and each training fold the other
    labeled samples plus every unlabeled sample.

    Parameters
    ----------
    n_splits : int, default=5
        Number of folds, at least 2 and at most the number of labeled samples.
    shuffle : bool, default=False
        Whether to shuffle the labeled samples before splitting them.
    random_state : int, RandomState instance or None, default=None
        Seeds the shuffle when ``shuffle=True``; pass an int for the same
        folds at every call.

    See Also
    --------
    SemiSupervisedStratifiedKFold : Keeps the share of each class in every
        fold (the better choice for classifiers).
    RepeatedSemiSupervisedKFold : Repeats the split with other shuffles.

    Examples
    --------
    >>> import numpy as np
    >>> from skassoc.model_selection import SemiSupervisedKFold
    >>> y = np.array([0, -1, 1, -1, 0, 1, -1, 1])
    >>> for train, test in SemiSupervisedKFold(n_splits=2).split(y, y):
    ...     print(train, test)
    [1 3 5 6 7] [0 2 4]
    [0 1 2 3 4 6] [5 7]
    """


class SemiSupervisedStratifiedKFold(_StratifiedCheck, _KFoldSplitter):
    """Stratified K-fold over the labeled samples; training keeps the unlabeled.

    The labeled samples are split as
    :class:`~sklearn.model_selection.StratifiedKFold` would split them alone,
    so every test fold holds about the same share of each class; each
    training fold adds every unlabeled sample to the labeled samples of the
    other folds.

    Parameters
    ----------
    n_splits : int, default=5
        Number of folds, at least 2. Every class needs at least ``n_splits``
        labeled samples.
    shuffle : bool, default=False
        Whether to shuffle the labeled samples of each class before splitting.
    random_state : int, RandomState instance or None, default=None
        Seeds the shuffle when ``shuffle=True``; pass an int for the same
        folds at every call.

    See Also
    --------
    RepeatedSemiSupervisedStratifiedKFold : Repeats the split with other
        shuffles, for steadier scores from few labels.

    Examples
    --------
    >>> import numpy as np
    >>> from skassoc.model_selection import SemiSupervisedStratifiedKFold
    >>> y = np.array([0, -1, 1, -1, 0, 1, -1, 1, 0])
    >>> cv = SemiSupervisedStratifiedKFold(n_splits=3)
    >>> for train, test in cv.split(y, y):
    ...     print(train, test, y[test])
    [1 3 4 5 6 7 8] [0 2] [0 1]
    [0 1 2 3 6 7 8] [4 5] [0 1]
    [0 1 2 3 4 5 6] [7 8] [1 0]
    """

    _labeled = StratifiedKFold


class RepeatedSemiSupervisedKFold(_RepeatedSplitter):
    """:class:`SemiSupervisedKFold` repeated with a new shuffle each time.

    The labeled samples are split as
    :class:`~sklearn.model_selection.RepeatedKFold` would split them alone;
    every training fold keeps all unlabeled samples.

    Parameters
    ----------
    n_splits : int, default=5
        Number of folds of each repetition, at least 2.
    n_repeats : int, default=10
        Number of repetitions.
    random_state : int, RandomState instance or None, default=None
        Seeds the shuffles; pass an int for the same folds at every call.

    Examples
    --------
    >>> import numpy as np
    >>> from skassoc.model_selection import RepeatedSemiSupervisedKFold
    >>> y = np.array([0, -1, 1, -1, 0, 1, -1, 1])
    >>> cv = RepeatedSemiSupervisedKFold(n_splits=2, n_repeats=3, random_state=0)
    >>> cv.get_n_splits()
    6
    """


class RepeatedSemiSupervisedStratifiedKFold(_StratifiedCheck, _RepeatedSplitter):
    """:class:`SemiSupervisedStratifiedKFold` repeated with a new shuffle each time.

    The labeled samples are split as
    :class:`~sklearn.model_selection.RepeatedStratifiedKFold` would split
    them alone; every training fold keeps all unlabeled samples. With few
    labels each test fold is small, and repeating the split with other
    shuffles averages out part of the noise of the scores.

    Parameters
    ----------
    n_splits : int, default=5
        Number of folds of each repetition, at least 2. Every class needs at
        least ``n_splits`` labeled samples.
    n_repeats : int, default=10
        Number of repetitions.
    random_state : int, RandomState instance or None, default=None
        Seeds the shuffles; pass an int for the same folds at every call.

    Examples
    --------
    >>> import numpy as np
    >>> from skassoc.model_selection import RepeatedSemiSupervisedStratifiedKFold
    >>> y = np.array([0, -1, 1, -1, 0, 1, -1, 1, 0])
    >>> cv = RepeatedSemiSupervisedStratifiedKFold(
    ...     n_splits=3, n_repeats=2, random_state=0
    ... )
    >>> cv.get_n_splits()
    6
    >>> all(set(y[test]) == {0, 1} for _, test in cv.split(y, y))
    True
    """

    _labeled = RepeatedStratifiedKFold


class _LabeledScorer:
    """A scorer that drops the unlabeled samples, then calls ``scorer``."""

    def __init__(self, scorer, scoring):
        self._scorer = scorer
        # What the user asked for, for the repr only.
        self._scoring = scoring

    def __repr__(self):
        return f"labeled_scorer({self._scoring!r})"

    def __call__(self, estimator, X, y_true, sample_weight=None, **kwargs):
        """Score ``estimator`` on the labeled samples of ``(X, y_true)``."""
        X, y_true, sample_weight = indexable(X, y_true, sample_weight)
        y_true = column_or_1d(np.asarray(y_true))
        labeled = np.flatnonzero(~unlabeled_mask(y_true))
        if labeled.size == 0:
            raise ValueError(
                "The samples to score hold no labeled sample (every label is "
                "-1). Use a splitter of skassoc.model_selection, whose test "
                "folds hold labeled samples only."
            )
        if labeled.size < _num_samples(X):
            X = _safe_indexing(X, labeled)
            y_true = y_true[labeled]
            if sample_weight is not None:
                sample_weight = _safe_indexing(sample_weight, labeled)
        if sample_weight is not None:
            kwargs["sample_weight"] = sample_weight
        if self._scorer is None:
            return estimator.score(X, y_true, **kwargs)
        return self._scorer(estimator, X, y_true, **kwargs)

    # Metadata such as sample_weight reaches a scorer through scikit-learn's
    # metadata routing (or, without it, where _accept_sample_weight says
    # yes); both questions go to the wrapped scorer.
    def _accept_sample_weight(self):
        if hasattr(self._scorer, "_accept_sample_weight"):
            return self._scorer._accept_sample_weight()
        # A callable of the user's own, or None: the estimator's score
        # method, which is unknown until the call.
        return self._scorer is not None and "sample_weight" in _parameters(self._scorer)

    def get_metadata_routing(self):
        """Metadata routing of the wrapped scorer (see scikit-learn's guide)."""
        if hasattr(self._scorer, "get_metadata_routing"):
            return self._scorer.get_metadata_routing()
        return MetadataRequest(owner=repr(self))

    def set_score_request(self, **kwargs):
        """Request metadata such as ``sample_weight`` of the wrapped scorer.

        Needs metadata routing switched on and a wrapped scorer made by
        scikit-learn (a name or :func:`~sklearn.metrics.make_scorer`).

        Returns
        -------
        self : object
            This scorer.
        """
        if not hasattr(self._scorer, "set_score_request"):
            raise TypeError(
                f"{self._scoring!r} does not take metadata requests; pass a "
                "scorer name or one made by sklearn.metrics.make_scorer."
            )
        self._scorer.set_score_request(**kwargs)
        return self


def _parameters(function):
    try:
        return signature(function).parameters
    except (TypeError, ValueError):
        return {}


def labeled_scorer(scoring=None):
    """Make a scorer, or several, that ignore unlabeled samples.

    The scorer drops the samples labeled ``-1`` (with their ``sample_weight``)
    and scores the estimator on the others with the scorer that ``scoring``
    names. Use it when the test folds may hold unlabeled samples, as with a
    ``cv`` of your own; the splitters of this module give test folds of
    labeled samples only, where scikit-learn's own scorers work as well.

    Parameters
    ----------
    scoring : str, callable, list, tuple, set, dict or None, default=None
        What to score, as scikit-learn's ``scoring`` parameter takes it: a
        scorer name such as ``"accuracy"`` or ``"neg_log_loss"``, a scorer
        ``scorer(estimator, X, y)`` (e.g. from
        :func:`~sklearn.metrics.make_scorer`), or None for the estimator's
        own ``score`` method. A list, tuple or set of names or a dict of
        ``{name: scoring}`` gives a dict of scorers, for the multi-metric
        ``scoring`` of :func:`~sklearn.model_selection.cross_validate` and
        the searches.

    Returns
    -------
    scorer : callable or dict of callables
        ``scorer(estimator, X, y, sample_weight=None)``; a dict of them for
        a list, tuple, set or dict.

    Raises
    ------
    ValueError
        When called on samples none of which is labeled.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.dummy import DummyClassifier
    >>> from skassoc.model_selection import labeled_scorer
    >>> X = np.zeros((5, 1))
    >>> y = np.array([0, 0, -1, 1, -1])
    >>> clf = DummyClassifier(strategy="constant", constant=0).fit(X, y)
    >>> round(labeled_scorer("accuracy")(clf, X, y), 3)  # 2 of 3 labeled
    0.667
    >>> sorted(labeled_scorer(["accuracy", "balanced_accuracy"]))
    ['accuracy', 'balanced_accuracy']
    """
    if isinstance(scoring, dict):
        return {name: labeled_scorer(value) for name, value in scoring.items()}
    if isinstance(scoring, (list, tuple, set)):
        return {name: labeled_scorer(name) for name in scoring}
    if scoring is None:
        return _LabeledScorer(None, None)
    # check_scoring turns a name into a scorer and refuses a bare metric
    # function such as accuracy_score, which takes (y_true, y_pred).
    return _LabeledScorer(check_scoring(scoring=scoring), scoring)


def _stacked_groups(n_candidates, groups_per_fold):
    """The candidates of each of a fold's stacked fits, as index ranges:
    ``groups_per_fold`` groups of near-equal size, never more groups than
    candidates."""
    n_groups = min(n_candidates, groups_per_fold)
    bounds = np.linspace(0, n_candidates, n_groups + 1).round().astype(int)
    return [range(start, stop) for start, stop in zip(bounds[:-1], bounds[1:])]


def _fit_and_score_fold(
    search, estimator, candidates, X, y, sample_weight, train, test
):
    """Fit candidates of a fold together from ``estimator``; their test
    scores (None for a failed fit), and the fit time a candidate (the
    stacked fit divided among them)."""
    started = time.perf_counter()
    fitted = fit_candidates(
        estimator,
        candidates,
        _safe_indexing(X, train),
        _safe_indexing(y, train),
        sample_weight=(
            None if sample_weight is None else _safe_indexing(sample_weight, train)
        ),
        stacking=search.stacking,
        raise_on_failure=search.error_score == "raise",
        # The fold's candidates are scored and dropped: nobody reads their
        # reports, each a pass over the training samples and a spread of
        # the labels over the inputs.
        fit_report=False,
    )
    seconds = (time.perf_counter() - started) / len(candidates)
    X_test, y_test = _safe_indexing(X, test), _safe_indexing(y, test)
    scores = [
        search.scorer_(est, X_test, y_test) if is_fitted(est) else None
        for est in fitted
    ]
    return scores, seconds


class StackedGridSearchCV(MetaEstimatorMixin, BaseEstimator):
    """Grid search over loss weights, the candidates of a fold trained together.

    Like :class:`~sklearn.model_selection.GridSearchCV`, but every
    candidate of a fold trains in one loop with the others
    (``skassoc._stacked.fit_candidates``; in ``groups_per_fold`` loops):
    they share the batches and the initial weights of the estimator's
    ``random_state``, so each candidate's scores are those of a separate
    fit up to float rounding, while a GPU computes the candidates side by
    side. The grid may vary the
    loss weights only (``walker_weight``, ``visit_weight``,
    ``logit_weight``); search other parameters with ``GridSearchCV``.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        Gives every parameter that the grid does not.
    param_grid : dict or list of dict
        Loss weights to try, as for ``GridSearchCV``.
    scoring : str, callable or None, default=None
        One metric, as :func:`labeled_scorer` takes it (None: the
        estimator's ``score``, the accuracy on labeled samples). The
        candidates it scores have no ``fit_report_`` (None, see ``refit``).
    cv : int, cross-validation generator or iterable, default=None
        None: :class:`SemiSupervisedStratifiedKFold` with 5 folds; an int:
        that many folds of it. Otherwise as for ``GridSearchCV``.
    refit : bool, default=True
        Fit the best candidate on all of ``X`` (a plain ``fit``) as
        ``best_estimator_``. The refit checks itself as the estimator's
        ``fit_report`` says; the candidates fitted on the folds never do
        (they are scored and dropped), and ``mean_fit_time`` holds no check.
    error_score : "raise" or float, default=np.nan
        Score of a candidate whose training loss became NaN or infinite; with
        ``"raise"``, the search raises at the first fold where one does.
    stacking : {"auto", "streams"}, default="auto"
        How the candidates are computed: each on a CUDA stream of its own
        (``"streams"``, which ``"auto"`` is) inside one captured graph.
    n_jobs : int, default=None
        Stacked fits trained at once through :class:`joblib.Parallel`
        (None: one, unless in a :func:`joblib.parallel_backend` context).
        Under joblib's Dask backend with one worker per GPU, each worker
        trains a stacked fit on its GPU (see the user guide's "Several
        GPUs").
    groups_per_fold : int, default=1
        The number of stacked fits each fold's candidates are split into,
        each its own joblib task; capped at the number of candidates. 1
        trains a fold's candidates together, the most a GPU gains from
        stacking; with more GPU workers than folds, split the folds to keep
        every worker busy (two folds on four workers:
        ``groups_per_fold=2``). A fold's groups start from one seed: with a
        ``random_state`` that is not an int, one drawn for the fold.

    Attributes
    ----------
    cv_results_ : dict of ndarray
        ``params``, ``param_<name>``, ``split<i>_test_score``,
        ``mean_test_score``, ``std_test_score``, ``rank_test_score`` and
        ``mean_fit_time`` (a stacked fit's time divided among its candidates).
    best_index_, best_params_, best_score_
        The candidate of the highest mean score.
    best_estimator_ : SemiSupervisedAssociationClassifier
        With ``refit=True``.
    n_splits_ : int
    scorer_ : callable

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc.model_selection import StackedGridSearchCV
    >>> X, y = make_blobs(90, centers=2, random_state=0)
    >>> y[30:] = -1
    >>> clf = SemiSupervisedAssociationClassifier(
    ...     network="mlp", labeled_per_class=3, max_iter=20, device="cpu",
    ...     random_state=0)
    >>> search = StackedGridSearchCV(
    ...     clf, {"visit_weight": [0.5, 1.0], "walker_weight": [0.5, 1.0]}, cv=3
    ... ).fit(X, y)
    >>> len(search.cv_results_["params"]), sorted(search.best_params_)
    (4, ['visit_weight', 'walker_weight'])
    """

    _parameter_constraints = {
        "estimator": [HasMethods(["fit", "predict"])],
        "param_grid": [dict, list],
        "scoring": [str, callable, None, list, tuple, set, dict],
        "cv": ["cv_object"],
        "refit": ["boolean"],
        "error_score": [StrOptions({"raise"}), numbers.Real],
        "stacking": [StrOptions(set(STACKINGS))],
        "n_jobs": [numbers.Integral, None],
        "groups_per_fold": [Interval(numbers.Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        estimator,
        param_grid,
        *,
        scoring=None,
        cv=None,
        refit=True,
        error_score=np.nan,
        stacking="auto",
        n_jobs=None,
        groups_per_fold=1,
    ):
        self.estimator = estimator
        self.param_grid = param_grid
        self.scoring = scoring
        self.cv = cv
        self.refit = refit
        self.error_score = error_score
        self.stacking = stacking
        self.n_jobs = n_jobs
        self.groups_per_fold = groups_per_fold

    # The estimator validates its own parameters when it fits.
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y, sample_weight=None):
        """Score every candidate on every fold, then refit the best one.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...)
            Training inputs, as for the estimator's ``fit``.
        y : array-like of shape (n_samples,)
            Labels, ``-1`` for unlabeled samples.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the classification loss, cut into
            folds with ``X`` (and passed whole to the refit); the scores are
            not weighted.

        Returns
        -------
        self : StackedGridSearchCV

        Raises
        ------
        ValueError
            If every candidate's fit failed on every fold (as
            ``GridSearchCV`` raises).
        NonFiniteLossError
            With ``error_score="raise"``, if a candidate's loss became NaN or
            infinite.
        KeyboardInterrupt
            On a Ctrl-C: the search stops, and sets no results.
        """
        if isinstance(self.scoring, (list, tuple, set, dict)):
            raise ValueError(
                "StackedGridSearchCV scores one metric; pass one name or scorer."
            )
        candidates = check_candidate_params(ParameterGrid(self.param_grid))
        X, y, sample_weight = indexable(X, y, sample_weight)
        cv = SemiSupervisedStratifiedKFold() if self.cv is None else self.cv
        if isinstance(cv, numbers.Integral):
            cv = SemiSupervisedStratifiedKFold(cv)
        cv = check_cv(cv, y, classifier=True)
        self.scorer_ = labeled_scorer(self.scoring)
        splits = list(cv.split(X, y))
        groups = _stacked_groups(len(candidates), self.groups_per_fold)
        # One task a group of a fold's candidates trained together: under
        # joblib's Dask backend every worker (one a GPU) trains a group.
        tasks = [(fold, group) for fold in range(len(splits)) for group in groups]
        starts = self._fold_estimators(len(splits))
        done = Parallel(n_jobs=self.n_jobs)(
            delayed(_fit_and_score_fold)(
                self,
                starts[fold],
                [candidates[i] for i in group],
                X,
                y,
                sample_weight,
                *splits[fold],
            )
            for fold, group in tasks
        )
        scores = np.empty((len(splits), len(candidates)), dtype=object)
        times = np.empty(scores.shape)
        for (fold, group), (group_scores, seconds) in zip(tasks, done, strict=True):
            scores[fold, group] = group_scores
            times[fold, group] = seconds
        failed = scores == None  # noqa: E711 -- elementwise, on objects
        if failed.all():
            raise ValueError(
                f"All the {scores.size} fits failed (their losses became NaN or "
                "infinite; a warning names each). Lower the learning_rate, or "
                "set error_score='raise' to see the first failure."
            )
        scores[failed] = self.error_score
        self._set_results(candidates, scores.astype(float), times)
        if self.refit:
            self.best_estimator_ = clone(self.estimator).set_params(**self.best_params_)
            self.best_estimator_.fit(X, y, sample_weight=sample_weight)
        return self

    def _fold_estimators(self, n_folds):
        """The estimator each fold's stacked fits start from. A
        ``random_state`` that is not an int draws a seed at every fit: when
        a fold is split into groups, its groups get one seed drawn for the
        fold, so that they start as one stacked fit would."""
        random_state = self.estimator.get_params().get("random_state")
        if self.groups_per_fold == 1 or isinstance(random_state, numbers.Integral):
            return [self.estimator] * n_folds
        rng = check_random_state(random_state)
        return [
            clone(self.estimator).set_params(random_state=fit_seed(rng))
            for _ in range(n_folds)
        ]

    def _set_results(self, candidates, scores, times):
        """``cv_results_`` and the best candidate from (n_splits, K) scores
        and fit times."""
        means = scores.mean(axis=0)
        results = {"params": candidates, "mean_fit_time": times.mean(axis=0)}
        for name in sorted({n for params in candidates for n in params}):
            column = np.ma.masked_all(len(candidates), dtype=object)
            for i, params in enumerate(candidates):
                if name in params:
                    column[i] = params[name]
            results[f"param_{name}"] = column
        for i, split in enumerate(scores):
            results[f"split{i}_test_score"] = split
        results["mean_test_score"] = means
        results["std_test_score"] = scores.std(axis=0)
        # As GridSearchCV ranks: ties share the best rank, NaN ranks last.
        finite = np.where(np.isnan(means), -np.inf, means)
        results["rank_test_score"] = rankdata(-finite, method="min").astype(np.int32)
        self.cv_results_ = results
        self.n_splits_ = scores.shape[0]
        self.best_index_ = int(np.argmin(results["rank_test_score"]))
        self.best_params_ = candidates[self.best_index_]
        self.best_score_ = float(means[self.best_index_])

    def _check_refitted(self):
        if not hasattr(self, "best_estimator_"):
            raise NotFittedError(
                "StackedGridSearchCV has no best_estimator_: call fit with refit=True."
            )
        return self.best_estimator_

    def predict(self, X):
        """Predict with ``best_estimator_``."""
        return self._check_refitted().predict(X)

    def predict_proba(self, X):
        """Class probabilities of ``best_estimator_``."""
        return self._check_refitted().predict_proba(X)

    def score(self, X, y):
        """Score ``best_estimator_`` on ``(X, y)`` with ``scorer_``."""
        return self.scorer_(self._check_refitted(), X, y)
