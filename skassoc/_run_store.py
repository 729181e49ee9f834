"""A directory of training runs that later fits continue (``resume_from``).

Successive halving over ``max_iter`` (scikit-learn's
``HalvingGridSearchCV(resource="max_iter")``) fits every surviving candidate
again with more steps, each time on a fresh clone. Given a :class:`RunStore`
as ``resume_from``, each such fit finds the run that the same candidate
left on the same fold in the previous round and continues it, instead of
training the first steps again.
"""

import os
from pathlib import Path

import joblib

__all__ = ["RunStore"]

# The parameters that do not change what a fit trains: fits that differ only
# in these continue each other's runs.
_NOT_IN_KEY = frozenset(
    {
        "max_iter",
        "verbose",
        "callbacks",
        "warm_start",
        "resume_from",
        "predict_batch_size",
        "fit_report",
    }
)


class RunStore:
    """A directory of training runs that fits with ``resume_from`` continue.

    A fit given ``resume_from=RunStore(directory)`` looks there for the run
    of an earlier fit with the same parameters (all but ``max_iter``,
    ``verbose``, ``callbacks``, ``warm_start``, ``predict_batch_size`` and
    ``fit_report``) on the same training data (``X``, ``y`` and
    ``sample_weight``, compared by their hash). If that run stopped before
    this fit's ``max_iter``, the fit continues it, as ``warm_start``
    continues an estimator's own run; otherwise it trains from scratch.
    Either way it stores its own run there when it ends (a model file with
    the run's state, one per parameters and data), replacing the earlier
    one.

    This lets successive halving over ``max_iter`` continue each
    candidate's run from round to round, though every round fits a fresh
    clone. Fits continue runs only with an int ``random_state`` and a
    built-in network (a run is a model file). The key hashes the whole of
    ``X`` once per fit (a memory-mapped ``X`` is read through once).

    Parameters
    ----------
    directory : str or os.PathLike
        Where the runs are kept; created when the first run is stored.

    Examples
    --------
    >>> import tempfile
    >>> from sklearn.datasets import make_blobs
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc.model_selection import RunStore
    >>> X, y = make_blobs(90, centers=2, random_state=0)
    >>> y[30:] = -1
    >>> store = RunStore(tempfile.mkdtemp())
    >>> clf = SemiSupervisedAssociationClassifier(
    ...     network="mlp", max_iter=20, device="cpu", random_state=0,
    ...     resume_from=store).fit(X, y)
    >>> more = SemiSupervisedAssociationClassifier(
    ...     network="mlp", max_iter=40, device="cpu", random_state=0,
    ...     resume_from=store).fit(X, y)      # trains steps 21 to 40 only
    >>> more.n_iter_
    40
    """

    def __init__(self, directory):
        self.directory = directory

    def __repr__(self):
        return f"RunStore({os.fspath(self.directory)!r})"

    def path(self, estimator, inputs):
        """The file of ``estimator``'s run on ``inputs``."""
        params = {
            name: value
            for name, value in estimator.get_params(deep=False).items()
            if name not in _NOT_IN_KEY
        }
        data = (inputs.data, inputs.encoded, inputs.classes, inputs.sample_weight)
        key = joblib.hash((type(estimator).__name__, params, data))
        return Path(self.directory) / f"{key}.skassoc"
