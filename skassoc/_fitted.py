"""The fitted state of an estimator, set and read in one piece.

``fit`` and ``load`` build a :class:`FittedState` and hand it to
:func:`set_fitted_state`, which writes every fitted attribute at once;
``predict``, ``transform`` and ``save`` read them back with
:func:`get_fitted_state`. Both hold one lock, so a prediction or a save in
another thread sees the old model or the new one, never a mix of the two
(say, the new ``n_features_in_`` with the old network).
"""

import threading
from dataclasses import dataclass, fields

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

__all__ = ["FittedState", "set_fitted_state", "get_fitted_state"]

_STATE_LOCK = threading.RLock()


@dataclass(frozen=True)
class FittedState:
    """Everything ``fit`` learns; each field is the attribute of its name + ``_``.

    Attributes
    ----------
    model : AssociationModel
        The trained network (``model_``).
    classes : ndarray
        Sorted labels of the labeled samples (``classes_``).
    class_prior : ndarray
        The class frequencies that predictions assume (``class_prior_``),
        in the order of ``classes``.
    input_shape : tuple of int or None
        ``(channels, height, width)`` of one image, None for feature rows.
    network : str
        Name of the built-in network, or ``"custom"``.
    n_features_in : int
        Values in one sample.
    feature_names_in : ndarray or None
        DataFrame column names (``feature_names_in_``), None without them
        (the attribute is then absent, as scikit-learn has it).
    n_iter : int
        Training steps completed.
    history : dict of lists
        The loss and validation curves.
    device : torch.device
        Where the model lives.
    training_state : TrainingState or None
        What continuing the run needs (``training_state_``): Adam's moments,
        the schedule's step, the moving average, the random streams; None
        when the run cannot be continued (see ``warm_start``).
    fit_report : FitReport or None
        What the fit says about itself (``fit_report_``); None for a model
        saved without one, a checkpoint, or a fit interrupted while the
        report was computed.
    """

    model: torch.nn.Module
    classes: np.ndarray
    class_prior: np.ndarray
    input_shape: tuple | None
    network: str
    n_features_in: int
    feature_names_in: np.ndarray | None
    n_iter: int
    history: dict
    device: torch.device
    training_state: object = None
    fit_report: object = None


_NAMES = tuple(field.name for field in fields(FittedState))


def set_fitted_state(estimator, state):
    """Replace every fitted attribute of ``estimator`` with those of ``state``."""
    values = {f"{name}_": getattr(state, name) for name in _NAMES}
    if state.feature_names_in is None:
        del values["feature_names_in_"]
    with _STATE_LOCK:
        estimator.__dict__.pop("feature_names_in_", None)
        estimator.__dict__.update(values)


def get_fitted_state(estimator):
    """The fitted attributes of ``estimator`` as one consistent :class:`FittedState`.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        If the estimator is not fitted.
    """
    check_is_fitted(estimator)
    with _STATE_LOCK:
        attributes = estimator.__dict__
        return FittedState(
            **{
                name: attributes.get(f"{name}_")
                for name in _NAMES
                if name != "feature_names_in"
            },
            feature_names_in=attributes.get("feature_names_in_"),
        )


def is_fitted(estimator):
    """Whether ``fit`` (or ``load``) has completed on ``estimator``."""
    return "model_" in estimator.__dict__
