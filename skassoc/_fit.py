"""Fit K >= 1 estimators in one engine run and give each its fitted state.

``SemiSupervisedAssociationClassifier.fit`` is K = 1;
:func:`~skassoc._stacked.fit_candidates` (``StackedGridSearchCV``) passes K
clones that differ only in their loss weights. Both come here after their
own checks: the models are built, the batches made, each estimator's
callbacks gathered, the engine run, and the fitted states set.
"""

import copy
import math
import warnings
from dataclasses import replace

import joblib
import numpy as np
import torch
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning

from ._engine._batches import make_batches
from ._engine._builtin import History, ProgressBar, Validation
from ._engine._callback import check_callbacks
from ._engine._device import seeded_rng, torch_threads
from ._engine._loop import Member, train
from ._engine._runner import (
    DeviceRunner,
    check_same_everywhere,
    computed_by_process_0,
    raised_together,
)
from ._engine._sync_batch_norm import check_batch_norms
from ._fitted import FittedState, set_fitted_state
from ._params import param_value, varying_params
from ._prior import uniform_prior
from ._utils import user_stacklevel

__all__ = ["train_estimators", "continued_run", "warn_if_labels_unlearned"]


def continued_run(previous, max_iter):
    """The training state a warm start continues, or None for a new run.

    A previous fit that stopped before ``max_iter`` steps of its run (a
    Ctrl-C, a callback's stop, a lower ``max_iter``) is continued to
    ``max_iter``; one that ran them all (or kept the weights of an earlier
    step) starts a new run from its weights.
    """
    state = getattr(previous, "training_state", None)
    if state is None or state.n_iter >= max_iter:
        return None
    return state


def train_estimators(
    estimators,
    inputs,
    settings,
    *,
    previous=None,
    validation=None,
    loss_weights=None,
    group=None,
):
    """Train a model for each estimator in one run; set their fitted states.

    Parameters
    ----------
    estimators : list of SemiSupervisedAssociationClassifier
        Validated; they differ at most in their loss weights.
    inputs : TrainingData
    settings : FitSettings
        Resolved for ``estimators[0]``.
    previous : FittedState, optional
        The fit a warm start continues from.
    validation : tuple (X_val, y_val), optional
        Scored during training (and early stopping's set).
    loss_weights : ndarray of shape (n_samples,), optional
        Factors of the samples' classification losses.
    group : torch.distributed.ProcessGroup, optional
        Train the one estimator data-parallel with the processes of
        ``group`` (whose seed they agreed on). Stacked candidates train in
        each process on its own.

    Returns
    -------
    results : list of TrainingResult
        One per estimator. An estimator whose loss became NaN or infinite is
        left as it was; the others are fitted (also when training was
        interrupted or a callback raised: the caller raises afterwards).
    """
    device = settings.device
    if group is not None and len(estimators) > 1:
        raise ValueError("Stacked candidates do not train data-parallel.")
    # Callbacks may differ between processes: so may their checks' outcome.
    with raised_together(group, "the checks of their callbacks"):
        for estimator in estimators:
            check_callbacks(estimator.callbacks)
    if group is not None:
        check_same_everywhere(_params_summary(estimators[0]), group, "parameters")
        # (fit agreed on the seed before its validation split.)
        check_same_everywhere(_data_summary(inputs), group, "training data")
    configs = [_config_of(settings.training, est) for est in estimators]
    with seeded_rng(settings.seed, device), torch_threads(device):
        # Up to the first collective (the parameters' broadcast), each
        # process may fail on its own (memory, its callbacks' set-up).
        with raised_together(group, "building their model, batches or callbacks"):
            models, batches, members, runner = _build(
                estimators, inputs, settings, previous, validation, loss_weights, group
            )
        with runner, runner.whole_batch_norms(models):
            runner.broadcast_parameters(models[0])
            results = train(models, batches, configs, runner, members)
        # Inside the thread setting: class_prior="auto" predicts on the CPU.
        for est, m, result in zip(estimators, models, results, strict=True):
            if result.failed_at is None:
                _set_state(est, m, result, inputs, settings, group)
    return results


def _build(estimators, inputs, settings, previous, validation, loss_weights, group):
    """The models, batches, callbacks (members) and device runner of a run."""
    # The order of every fit: the model first, then the batches (the
    # sampler of shuffled epochs takes its seed from the CPU generator).
    model = estimators[0]._initial_model(inputs, settings, previous)
    batches = make_batches(inputs, settings, loss_weights)
    if group is not None:
        check_batch_norms(model)
    models = [model] + [copy.deepcopy(model) for _ in estimators[1:]]
    training = settings.training
    runner = DeviceRunner(
        settings.device, training.precision, training.cuda_graph, group=group
    )
    state = continued_run(previous, training.max_iter)
    # One progress bar for a data-parallel fit: process 0's.
    members = [
        _member(
            est, m, inputs, settings, validation, previous, state, k == 0, runner.rank
        )
        for k, (est, m) in enumerate(zip(estimators, models, strict=True))
    ]
    return models, batches, members, runner


#: Parameters that may differ between the processes of a data-parallel fit.
_PER_PROCESS = ("device", "devices", "callbacks", "verbose", "resume_from")


def _params_summary(estimator):
    """A hash of the parameters every process of a data-parallel fit shares
    (a custom network by its class: its weights are process 0's anyway)."""
    params = {
        name: type(value).__name__ if isinstance(value, torch.nn.Module) else value
        for name, value in estimator.get_params(deep=False).items()
        if name not in _PER_PROCESS
    }
    return joblib.hash(params)


def _data_summary(inputs):
    """What processes compare to check that they train on the same data:
    the shape, the labels and a few rows (hashing all of ``X`` would read a
    memory map whole)."""
    data = inputs.data
    rows = np.linspace(0, len(data) - 1, num=min(len(data), 64)).astype(int)
    return (
        tuple(data.shape),
        joblib.hash(inputs.encoded),
        joblib.hash(np.asarray(data[rows])),
        joblib.hash(inputs.sample_weight),
    )


def _config_of(training, estimator):
    """``training`` with the loss weights in which ``estimator`` may differ."""
    weights = dict(training.loss_weights)
    weights.update({n: float(param_value(estimator, n)) for n in varying_params()})
    if weights == training.loss_weights:
        return training
    return replace(training, loss_weights=weights)


def _member(
    estimator, model, inputs, settings, validation, previous, state, first, rank
):
    """The engine's view of one estimator: its callbacks, built-in first."""
    training = settings.training
    callbacks = [History(validation is not None)]
    if validation is not None:
        callbacks.append(
            Validation(
                estimator._scorer_during_fit(model, validation, inputs, settings),
                training.validation_interval,
                training.early_stopping,
                training.n_iter_no_change,
                training.tol,
            )
        )
    if training.verbose and first and rank == 0:
        callbacks.append(ProgressBar(training.verbose))
    callbacks += list(estimator.callbacks or ())  # checked by train_estimators

    def snapshot(run):
        return _snapshot(estimator, run, inputs, settings)

    history = previous.history if state is not None else {}
    return Member(estimator, callbacks, snapshot, state, history)


def _snapshot(estimator, run, inputs, settings):
    """A fitted copy of ``estimator`` as if its run ended now (checkpoints)."""
    with run.fitted_weights():
        model = copy.deepcopy(run.model)
    model.eval()
    fitted = clone(estimator)
    class_prior = estimator._fitted_class_prior(model, inputs, settings)
    state = _fitted_state(
        model,
        class_prior,
        inputs,
        settings,
        n_iter=run.step,
        history=copy.deepcopy(run.history),
        training_state=run.training_state(),
    )
    set_fitted_state(fitted, state)
    return fitted


def _set_state(estimator, model, result, inputs, settings, group):
    """Give ``estimator`` the fitted state of its trained ``model`` (in a
    group, process 0 estimates the class frequencies and writes the report
    for every process: they hold the same model)."""
    with computed_by_process_0(
        group, lambda: _after_training(estimator, model, inputs, settings)
    ) as (class_prior, report, interrupted):
        result.after_training_interrupted = interrupted
        state = _fitted_state(
            model,
            class_prior,
            inputs,
            settings,
            n_iter=result.n_iter,
            history=result.history,
            training_state=result.training_state,
            fit_report=report,
        )
        set_fitted_state(estimator, state)


def _after_training(estimator, model, inputs, settings):
    """The fitted class frequencies and report of ``model``, and what a
    Ctrl-C interrupted of them (None: nothing)."""
    class_prior = report = interrupted = None
    try:
        class_prior = estimator._fitted_class_prior(model, inputs, settings)
        if estimator.fit_report:
            report = estimator._fit_report(model, inputs, settings)
    except KeyboardInterrupt:
        # Training has ended: its model is kept, without a report and (when
        # they were being estimated) with equal class frequencies.
        interrupted = "class_prior" if class_prior is None else "report"
        if class_prior is None:
            class_prior = uniform_prior(len(inputs.classes))
    return class_prior, report, interrupted


def _fitted_state(model, class_prior, inputs, settings, **run):
    """The :class:`FittedState` of a trained ``model``; ``run`` gives its
    ``n_iter``, ``history``, ``training_state`` and (after a fit) ``fit_report``."""
    return FittedState(
        model=model,
        classes=inputs.classes,
        class_prior=class_prior,
        input_shape=inputs.image_shape,
        network=settings.spec.network,
        n_features_in=inputs.n_features,
        feature_names_in=inputs.feature_names,
        device=settings.device,
        **run,
    )


def interruption(result, config):
    """What a fit cut short by a Ctrl-C kept, or None if it was not."""
    parts = []
    if result.interrupted and result.error is None:
        kept = (
            f"the best-scoring weights (step {result.best_step})"
            if result.best_step is not None
            else "the weights of the last completed step"
        )
        parts.append(
            f"Training was interrupted after {result.n_iter} of "
            f"{config.max_iter} steps; the estimator is fitted with {kept}. "
            "Fit again with warm_start=True to continue its run."
        )
    after = result.after_training_interrupted
    if after == "class_prior":
        parts.append(
            "Interrupted while estimating the class frequencies "
            "(class_prior='auto') after training; the estimator is fitted with "
            "the trained weights and predicts with equal class frequencies. "
            "Fit again, or set class_prior."
        )
    elif after == "report":
        parts.append(
            "Interrupted while computing fit_report_ after training; the "
            "estimator is fitted with the trained weights, without a report "
            "(fit_report_ is None)."
        )
    return " ".join(parts) if parts else None


#: A fit of at least this many steps whose classification loss on the
#: labeled batch ends above this share of ln(n_classes) gets a warning.
UNLEARNED_MIN_STEPS = 100
UNLEARNED_LOSS_SHARE = 0.9


def warn_if_labels_unlearned(result, n_classes, config):
    """Warn when a fit ends predicting its labeled batch no better than a guess.

    The labeled batch holds as many samples of every class, so a network
    whose predictions do not depend on its input (a fit that diverged into
    one class, say) has a classification loss of at least ln(n_classes)
    there. Short fits, fits without the loss and fits that kept their
    best-scoring weights are not checked.
    """
    losses = result.history.get("logit") or [math.nan]
    skip = result.n_iter < UNLEARNED_MIN_STEPS or result.best_step is not None
    if skip or config.loss_weights["logit_weight"] == 0 or n_classes < 2:
        return
    guess = math.log(n_classes)
    if losses[-1] >= UNLEARNED_LOSS_SHARE * guess:
        warnings.warn(
            f"The classification loss of the labeled samples ended at "
            f"{losses[-1]:.3f}, no lower than a constant guess among {n_classes} "
            f"classes ({guess:.3f}): the model predicts its own labels no better "
            "than chance. Training that diverged into predicting one class ends "
            "this way (lower learning_rate or lengthen lr_warmup_steps, and fit "
            "again), as do inputs that do not tell the classes apart.",
            ConvergenceWarning,
            stacklevel=user_stacklevel(),
        )
