"""Loss-weight candidates trained together: the engine with K models.

Candidates that differ only in their loss weights share everything else: the
network, the initial weights (one ``random_state``), and every batch and
augmentation the step draws. :func:`fit_candidates` trains them in one run
of the engine (``skassoc._engine``), which a single fit runs with one model:
each candidate follows the path its separate fit with the same
``random_state`` follows, up to the order of float operations, and every
setting of a single fit applies to each candidate (early stopping stops
each one on its own, a callback sees its own candidate's run).

On a GPU each candidate computes on a CUDA stream of its own, inside one
captured graph, so the GPU runs the candidates side by side; measured in
``benchmarks/bench_search.py``.
"""

import warnings

from sklearn.base import clone

from ._engine._loop import NonFiniteLossError
from ._fit import interruption, train_estimators
from ._inputs import (
    classification_weights,
    hold_out_validation,
    validate_training_inputs,
)
from ._params import param_value, varying_params
from ._resume import previous_run
from ._run_store import RunStore
from ._settings import (
    embeds_feature_vectors,
    fit_seed,
    resolve_consistency_weight,
    resolve_fit_settings,
)
from ._utils import user_stacklevel

__all__ = ["fit_candidates", "check_candidate_params", "STACKINGS"]

#: How the candidates are computed: ``"streams"`` (``"auto"``), each
#: candidate on a CUDA stream of its own.
STACKINGS = ("auto", "streams")


def check_candidate_params(param_list):
    """``param_list`` as a list of dicts over loss weights only.

    Raises
    ------
    ValueError
        If it is empty, or a candidate sets another parameter.
    """
    param_list = [dict(params) for params in param_list]
    if not param_list:
        raise ValueError("param_list holds no candidate; give at least one dict.")
    varying = varying_params()
    others = sorted({name for params in param_list for name in params} - set(varying))
    if others:
        raise ValueError(
            f"Stacked candidates may differ only in their loss weights "
            f"{list(varying)}; these parameters differ too: {others}. Set "
            "them on the estimator, or search them with "
            "sklearn.model_selection.GridSearchCV."
        )
    return param_list


def _check_same_consistency(candidates, inputs, settings):
    """Refuse candidates whose ``consistency_weight="auto"`` resolves apart.

    The loss draws a second augmented copy of the batch, so candidates with
    and without it cannot share the batches of their separate fits.
    """
    feature_vectors = embeds_feature_vectors(inputs, settings.spec)
    weights = {
        resolve_consistency_weight(c, settings.training.augmentation, feature_vectors)
        for c in candidates
    }
    if len(weights) > 1:
        raise ValueError(
            "The candidates' consistency_weight='auto' resolves to different "
            f"weights {sorted(weights)} (0 where both walker_weight and "
            "visit_weight are 0). Set consistency_weight on the estimator, or "
            "leave the all-zero pair out of the grid."
        )


def fit_candidates(
    estimator,
    param_list,
    X,
    y,
    *,
    sample_weight=None,
    stacking="auto",
    raise_on_failure=False,
    fit_report=None,
):
    """Fit one clone of ``estimator`` per parameter set, all in one training run.

    Every candidate gets the initial weights and the batches that a separate
    ``fit`` with the estimator's ``random_state`` gets, so its model is that
    fit's model up to the rounding of float operations (on a CPU, predicted
    probabilities agree to about 1e-5). Training K candidates together costs
    far less than K fits on a GPU, whose single fit leaves it mostly idle.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        Gives every parameter the candidates share (``fit_report`` unless
        given below); it is not changed. With
        ``warm_start=True`` and fitted, every candidate continues from its
        model (and its run, see ``warm_start``); so it does from the model
        file of ``resume_from`` (a RunStore is refused: it keeps one run per
        candidate).
    param_list : sequence of dict
        One dict per candidate, of loss weights only (``walker_weight``,
        ``visit_weight``, ``logit_weight``).
    X, y
        As for :meth:`SemiSupervisedAssociationClassifier.fit` (``-1`` marks
        unlabeled samples).
    sample_weight : array-like of shape (n_samples,), default=None
        As for :meth:`SemiSupervisedAssociationClassifier.fit`.
    stacking : {"auto", "streams"}, default="auto"
        How the candidates are computed (see the module's docstring).
    raise_on_failure : bool, default=False
        Raise if a candidate's loss becomes NaN or infinite, instead of
        leaving it unfitted.
    fit_report : bool or None, default=None
        Whether the candidates check themselves after training (see the
        estimator's ``fit_report``); None keeps the estimator's setting.

    Returns
    -------
    estimators : list of SemiSupervisedAssociationClassifier
        Fitted clones, in the order of ``param_list``. A candidate whose
        loss became NaN or infinite is left unfitted (with a warning); the
        others are fitted. Every ``history_`` holds the loss terms that any
        candidate turns on: a candidate that weighs one at 0 records it too.

    Raises
    ------
    ValueError
        If a candidate sets another parameter than a loss weight.
    NonFiniteLossError
        With ``raise_on_failure``, if a candidate's loss became NaN or
        infinite; no candidate is then fitted.
    KeyboardInterrupt
        On a Ctrl-C; the candidates keep the model of the steps completed
        and the search stops.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc._stacked import fit_candidates
    >>> X, y = make_blobs(60, centers=2, random_state=0)
    >>> y[10:] = -1
    >>> clf = SemiSupervisedAssociationClassifier(
    ...     max_iter=20, device="cpu", random_state=0)
    >>> grid = [{"visit_weight": 0.5}, {"visit_weight": 1.0}]
    >>> fitted = fit_candidates(clf, grid, X, y)
    >>> [est.visit_weight for est in fitted], fitted[0].predict(X[:2]).shape
    ([0.5, 1.0], (2,))
    """
    param_list = check_candidate_params(param_list)
    if stacking not in STACKINGS:
        raise ValueError(f"stacking must be one of {STACKINGS}; got {stacking!r}.")
    overrides = {} if fit_report is None else {"fit_report": fit_report}
    candidates = [
        clone(estimator).set_params(**params, **overrides) for params in param_list
    ]
    for candidate in candidates:
        candidate._validate_params()
    inputs = validate_training_inputs(candidates[0], X, y, sample_weight)
    # One seed for all: with a RandomState instance (or None) every
    # resolution would draw another seed, and the candidates must share one.
    seed = fit_seed(estimator.random_state)
    validation = None
    if estimator.early_stopping:
        inputs, validation = hold_out_validation(
            inputs, estimator.validation_fraction, seed
        )
    if isinstance(estimator.resume_from, RunStore):
        raise ValueError(
            "Stacked candidates cannot use a RunStore: it keeps a run per "
            "candidate's parameters, while stacked candidates share one start. "
            "Use it with GridSearchCV or HalvingGridSearchCV, or give "
            "resume_from a model file that every candidate starts from."
        )
    previous = previous_run(estimator, inputs).previous
    settings = resolve_fit_settings(candidates[0], inputs, previous, seed)
    _check_same_consistency(candidates, inputs, settings)
    results = train_estimators(
        candidates,
        inputs,
        settings,
        previous=previous,
        validation=validation,
        loss_weights=classification_weights(estimator.class_weight, inputs),
    )
    failed = {k for k, result in enumerate(results) if result.failed_at is not None}
    if failed and raise_on_failure:
        # The candidates are this function's own: none reaches the caller.
        raise NonFiniteLossError(_failure_message(candidates, failed))
    if failed:
        warnings.warn(
            _failure_message(candidates, failed, "they are left unfitted"),
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    if results[0].error is not None:
        raise results[0].error
    if results[0].interrupted:
        # A search must stop rather than score candidates cut short.
        raise KeyboardInterrupt(
            f"Stacked training was interrupted after {results[0].n_iter} of "
            f"{settings.training.max_iter} steps."
        )
    cut = [r for r in results if r.after_training_interrupted is not None]
    if cut:
        # A Ctrl-C after training (the class frequencies, the report) stops
        # a search too; the candidates keep what they were fitted with.
        raise KeyboardInterrupt(interruption(cut[0], settings.training))
    return candidates


def _failure_message(candidates, failed, outcome=None):
    """Which candidates' loss became NaN or infinite, and what to do."""
    names = [
        {n: param_value(candidates[i], n) for n in varying_params()}
        for i in sorted(failed)
    ]
    outcome = f"; {outcome}" if outcome else ""
    return (
        f"The training loss of {len(failed)} candidate(s) became NaN or "
        f"infinite ({names}){outcome}. Lower learning_rate or rescale X."
    )
