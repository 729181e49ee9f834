"""The ``Checkpoint`` callback: the model and its run's state on disk, every N steps.

A checkpoint is a model file with the optional training-state member (see
``_format``): it loads as a model, and a warm start of the loaded estimator
continues the run where the checkpoint was written.
"""

import os
from numbers import Integral

import torch
from sklearn.utils._param_validation import Interval, validate_parameter_constraints

from .._engine._callback import Callback
from ._atomic import check_target
from ._metadata import encode_params
from ._model_file import _check_builtin, save_model

__all__ = ["Checkpoint"]

_CONSTRAINTS = {
    "path": [str, os.PathLike],
    "every": [Interval(Integral, 1, None, closed="left")],
}


class Checkpoint(Callback):
    """Save the model with its training state every ``every`` steps.

    A checkpoint is a model file, as
    :meth:`~skassoc.SemiSupervisedAssociationClassifier.save` writes it with
    ``training_state=True``: the fitted model (it loads with
    :meth:`~skassoc.SemiSupervisedAssociationClassifier.load` and predicts)
    and what continuing its run needs: Adam's moments, the learning-rate
    schedule's step, the moving average of the weights (``ema_decay``), the
    balance loss's estimate and the random streams. To continue, load it,
    ``set_params(warm_start=True)`` and ``fit`` on the same data: the
    remaining steps up to ``max_iter`` train the model an uninterrupted fit
    would have (bitwise on a CPU). A checkpoint holds no callbacks (a model
    file never does): pass them again with ``set_params``.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write. ``"{step}"`` in it is replaced by the steps
        completed (:meth:`str.format`, so ``"{step:06d}"`` works too), which
        keeps one file per checkpoint; without it, each checkpoint replaces
        the previous one. Write a literal brace twice (``"{{"``). Each file
        is written under a temporary name and renamed, so a crash never
        leaves a torn checkpoint.
    every : int, default=1000
        Steps between checkpoints. A checkpoint is written at the first log
        point (see :mod:`skassoc.callbacks`) at least ``every`` steps after
        the previous one (or after the start of the fit).

    See Also
    --------
    skassoc.SemiSupervisedAssociationClassifier.save : Save a fitted estimator.
    skassoc.SemiSupervisedAssociationClassifier.load : Load a model file or checkpoint.

    Notes
    -----
    When the fit ends, a last checkpoint is written if steps were trained
    since the previous one, unless the loss became NaN or infinite: a fit
    interrupted with Ctrl-C, or stopped by a callback or an error in one,
    leaves its latest state on disk. Where early stopping put back the
    weights of an earlier step, that last file holds the fitted model
    without training state (a run cannot continue from those weights).

    In a data-parallel fit (``devices``, ``torchrun``) process 0 alone
    writes: every process holds the same model.

    The fits of a search (every candidate and fold, and every candidate of a
    stacked search) write to the same ``path``; keep a checkpoint callback
    for single fits, or give each search a path of its own.

    The arguments are checked when a fit begins, as is whether the estimator
    can be saved (a custom network cannot), so that a fit does not fail at
    its first checkpoint. Each checkpoint copies the model to the CPU and,
    with ``class_prior="auto"``, estimates the class frequencies, which
    takes a few predictions: keep ``every`` well above the log interval.

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> import numpy as np
    >>> from sklearn.datasets import make_blobs
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc.callbacks import Checkpoint
    >>> X, y = make_blobs(n_samples=200, centers=3, n_features=8, random_state=0)
    >>> y_semi = np.where(np.arange(len(y)) % 4 == 0, y, -1)
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "run-{step}.skassoc")
    >>> clf = SemiSupervisedAssociationClassifier(
    ...     network="mlp", hidden_layer_sizes=(16,), max_iter=20, device="cpu",
    ...     random_state=0, callbacks=[Checkpoint(path, every=10)])
    >>> clf = clf.fit(X, y_semi)
    >>> sorted(os.listdir(folder.name))
    ['run-10.skassoc', 'run-20.skassoc']
    >>> resumed = SemiSupervisedAssociationClassifier.load(
    ...     path.format(step=10), device="cpu")
    >>> resumed.n_iter_
    10
    >>> resumed.set_params(warm_start=True).fit(X, y_semi).n_iter_
    20
    >>> folder.cleanup()
    """

    def __init__(self, path, every=1000):
        # Stored as given: scikit-learn's clone deep-copies callbacks, and
        # they are checked when a fit begins.
        self.path = path
        self.every = every

    def on_fit_begin(self, run):
        """Check the arguments and the estimator; start counting steps (in
        process 0 of a data-parallel fit: the others hold the same model)."""
        self._last_written = None
        if run.rank != 0:
            return
        validate_parameter_constraints(
            _CONSTRAINTS,
            {"path": self.path, "every": self.every},
            caller_name=type(self).__name__,
        )
        self._template = os.fspath(self.path)
        check_target(self._file(run.step), "checkpoints")
        _check_savable(run.estimator)
        # Per fit: a callback object may serve several fits, and a continued
        # run starts at its earlier steps.
        self._last_written = run.step

    def on_log(self, run):
        """Write a checkpoint if ``every`` steps passed since the last one."""
        if (
            self._last_written is not None
            and run.step - self._last_written >= self.every
        ):
            self._write(run)

    def on_fit_end(self, run):
        """Write the steps trained since the last checkpoint, unless failed."""
        last = getattr(self, "_last_written", None)
        if last is not None and not run.failed and run.step > last:
            self._write(run)

    def _file(self, step):
        """The file of the checkpoint after ``step`` steps."""
        try:
            return self._template.format(step=step)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"Checkpoint's path {self._template!r} is formatted with "
                f"str.format(step=...), which fails on it ({type(exc).__name__}: "
                f"{exc}). Use {{step}} for the step and write a literal brace "
                "twice ({{ or }})."
            ) from None

    def _write(self, run):
        fitted = run.snapshot()
        # Early stopping put back earlier weights (on_fit_end): no run
        # continues from them, as none continues from the fitted estimator.
        continuable = (
            getattr(run, "best_step", None) is None
            and getattr(fitted, "training_state_", None) is not None
        )
        save_model(fitted, self._file(run.step), training_state=continuable)
        self._last_written = run.step


def _check_savable(estimator):
    """Refuse, before training, an estimator that no model file can hold."""
    if isinstance(estimator.network, torch.nn.Module):
        _check_builtin("custom")
    encode_params(estimator.get_params(deep=False))
