"""Loss-weight candidates trained together: one training loop for K models.

Candidates that differ only in their loss weights share everything else: the
network, the initial weights (one ``random_state``), and every batch and
augmentation the loop draws. They can therefore train side by side in one
loop: the batch is drawn once, each candidate embeds it with its own weights
and weighs its own losses, the K totals are summed and differentiated at
once (the candidates do not interact, so each one's gradient is that of its
own loss), and one Adam updates every candidate (Adam and its coupled weight
decay act element by element, so one optimizer over all candidates is K
independent ones). Each candidate thus follows the path its separate fit
with the same ``random_state`` follows, up to the order of float operations.

Two ways of computing the K candidates, the *stacking*:

- ``"vmap"``: the K models' parameters are stacked
  (:func:`torch.func.stack_module_state`) and one network call is
  vectorised over them with :func:`torch.vmap`; torch turns the K
  convolutions into one grouped convolution, the K linear layers into
  batched products. Few, wide kernels.
- ``"streams"``: the K models stay apart and run one after the other; on a
  GPU each on a CUDA stream of its own, so that the captured graph holds K
  independent branches the GPU runs side by side with the dense kernels of
  a single fit.

The whole step stays free of host synchronisations, so on a GPU it is
captured as one CUDA graph (with :class:`skassoc._engine._training._StepRunner`,
imported as it is).

Measured (``benchmarks/bench_search.py``, one H100, TF32, MNIST network, 8
candidates of 2,000 steps): 8 separate fits 24.2 s, ``"streams"`` 14.6 s
(1.65x), ``"vmap"`` 21.1 s (1.15x; cuDNN's grouped convolutions are slow at
these widths). One fit of a single model on an 8-fold batch took 14.0 s, so
this network gains at most about 1.7x on that GPU from any batching of 8
candidates' work; ``"streams"`` reaches 96 % of that, hence ``"auto"``.
"""

import copy
import warnings
from dataclasses import replace

import numpy as np
import torch
from sklearn.base import clone

from .._fitted import FittedState, set_fitted_state
from .._inputs import validate_training_inputs
from .._nn._networks import weight_tensors
from .._params import param_value, varying_params
from .._settings import (
    embeds_feature_vectors,
    resolve_consistency_weight,
    resolve_fit_settings,
)
from .._utils import user_stacklevel
from ._batches import make_batches
from ._device import (
    autocast_context,
    borrowed_streams,
    own_stream,
    precision_context,
    seeded_rng,
    torch_threads,
)
from ._ema import WeightAverage
from ._loss_terms import LOSS_TERMS, StepLoss, active_terms
from ._training import (
    NonFiniteLossError,
    _keep_lr_tensor,
    _learning_rate,
    _StepRunner,
    association_scale,
    augment_batch,
    class_frequencies,
    make_optimizer,
    make_scheduler,
    step_batch_layout,
)

__all__ = ["fit_candidates", "varying_params", "STACKINGS"]

#: How the candidates are computed (see the module's docstring).
STACKINGS = ("auto", "vmap", "streams")


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


def _check_shared(estimator, stacking):
    """Refuse estimator settings that the stacked loop does not implement."""
    if stacking not in STACKINGS:
        raise ValueError(f"stacking must be one of {STACKINGS}; got {stacking!r}.")
    # Each refused setting, with the value that the stacked loop implements.
    refused = {
        "warm_start": (bool(estimator.warm_start), False),
        # compile={} compiles too (with torch.compile's defaults).
        "compile": (
            isinstance(estimator.compile, dict) or bool(estimator.compile),
            False,
        ),
        # The stacked batches carry no loss factors, and no validation runs.
        "class_weight": (estimator.class_weight is not None, None),
        "early_stopping": (bool(estimator.early_stopping), False),
    }
    # A loss term's running estimate of the class mass (the balance loss)
    # would be one per candidate.
    for term in LOSS_TERMS.values():
        if "class_frequencies" in term.needs:
            weight = term.weight_param
            refused[weight] = (param_value(estimator, weight) != 0, 0)
    advice = [f"{name}={value!r}" for name, (on, value) in refused.items() if on]
    if advice:
        raise ValueError(
            f"Stacked fits do not support these settings; set {', '.join(advice)}, "
            "or fit such candidates one by one, e.g. with "
            "sklearn.model_selection.GridSearchCV."
        )


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
    estimator, param_list, X, y, *, stacking="auto", raise_on_failure=False
):
    """Fit one clone of ``estimator`` per parameter set, all in one training loop.

    Every candidate gets the initial weights and the batches that a separate
    ``fit`` with the estimator's ``random_state`` gets, so its model is that
    fit's model up to the rounding of float operations (on a CPU, predicted
    probabilities agree to about 1e-5). Training K candidates together costs
    far less than K fits on a GPU, whose single fit leaves it mostly idle.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        Gives every parameter the candidates share; it is not changed.
    param_list : sequence of dict
        One dict per candidate, of loss weights only (``walker_weight``,
        ``visit_weight``, ``logit_weight``).
    X, y
        As for :meth:`SemiSupervisedAssociationClassifier.fit` (``-1`` marks
        unlabeled samples).
    stacking : {"auto", "vmap", "streams"}, default="auto"
        How the candidates are computed (see :mod:`skassoc._engine._stacked`);
        ``"auto"`` is ``"streams"``. Results agree either way.
    raise_on_failure : bool, default=False
        Raise if a candidate's loss becomes NaN or infinite, instead of
        leaving it unfitted.

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
        If a candidate sets another parameter than a loss weight, or the
        estimator uses ``warm_start``, ``compile``, the balance loss,
        ``class_weight`` or ``early_stopping``.
    NonFiniteLossError
        With ``raise_on_failure``, if a candidate's loss became NaN or
        infinite; no candidate is then fitted.
    KeyboardInterrupt
        On a Ctrl-C; no candidate is then fitted (a search stops).

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc._engine._stacked import fit_candidates
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
    candidates = [clone(estimator).set_params(**params) for params in param_list]
    for candidate in candidates:
        candidate._validate_params()
    _check_shared(estimator, stacking)
    inputs = validate_training_inputs(candidates[0], X, y)
    # One resolution for all: with a RandomState instance (or None) every
    # resolution would draw another seed, and the candidates must share one.
    settings = resolve_fit_settings(candidates[0], inputs)
    _check_same_consistency(candidates, inputs, settings)
    configs = [_candidate_config(settings.training, c) for c in candidates]
    device = settings.device
    with seeded_rng(settings.seed, device), torch_threads(device):
        # The order of a single fit: the model first, then the batches (the
        # sampler of shuffled epochs takes its seed from the CPU generator).
        model = candidates[0]._initial_model(inputs, settings, None)
        batches = make_batches(inputs, settings)
        models = [model] + [copy.deepcopy(model) for _ in candidates[1:]]
        with precision_context(device, settings.training.precision):
            histories, n_iter, failed = train_candidates(
                models, batches, configs, device, stacking
            )
        if failed and raise_on_failure:
            raise NonFiniteLossError(_failure_message(candidates, failed))
        # Inside the thread setting: class_prior="auto" predicts on the CPU.
        trained = zip(candidates, models, histories, strict=True)
        _set_states(list(trained), n_iter, failed, inputs, settings)
    return candidates


def _candidate_config(training, candidate):
    """``training`` with the loss weights in which ``candidate`` may differ."""
    weights = dict(training.loss_weights)
    weights.update({n: float(param_value(candidate, n)) for n in varying_params()})
    return replace(training, loss_weights=weights)


def _set_states(trained, n_iter, failed, inputs, settings):
    """Give every candidate that trained to the end its fitted state.

    ``trained`` holds a ``(candidate, model, history)`` for every candidate.
    """
    candidates = [candidate for candidate, *_ in trained]
    for index, (candidate, model, history) in enumerate(trained):
        if index in failed:
            continue
        state = FittedState(
            model=model,
            classes=inputs.classes,
            class_prior=candidate._fitted_class_prior(model, inputs, settings),
            input_shape=inputs.image_shape,
            network=settings.spec.network,
            n_features_in=inputs.n_features,
            feature_names_in=inputs.feature_names,
            n_iter=n_iter,
            history=history,
            device=settings.device,
        )
        set_fitted_state(candidate, state)
    if failed:
        warnings.warn(
            _failure_message(candidates, failed, "they are left unfitted"),
            UserWarning,
            stacklevel=user_stacklevel(),
        )


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


def train_candidates(models, batches, configs, device, stacking="auto"):
    """Train ``models`` in place, candidate ``k`` with ``configs[k]``'s loss weights.

    Returns
    -------
    histories : list of dict
        Each candidate's loss history, as a single fit records it.
    n_iter : int
        Steps run.
    failed : set of int
        Candidates whose loss became NaN or infinite.
    """
    stacking = "streams" if stacking == "auto" else stacking
    if device.type != "cuda":
        return _train(models, batches, configs, device, None, stacking)
    with borrowed_streams(device) as streams, own_stream(device, streams[0]):
        return _train(models, batches, configs, device, streams, stacking)


def _train(models, batches, configs, device, streams, stacking):
    config = configs[0]
    for model in models:
        model.train()
    use_graph = config.cuda_graph and device.type == "cuda"
    kind = _VmapCandidates if stacking == "vmap" else _StreamCandidates
    candidates = kind(models, config, device)
    groups = [
        {"params": params, "weight_decay": scale}
        for scale, params in candidates.groups.items()
    ]
    optimizer = make_optimizer(groups, config.learning_rate, device, use_graph)
    lr_tensors = [group["lr"] for group in optimizer.param_groups]
    scheduler = make_scheduler(optimizer, config)
    step = _StackedStep(candidates, batches, optimizer, configs, device)
    run_step = _StepRunner(step, device, streams, use_graph)
    log = _StackedLog(step, config)
    for completed in range(1, config.max_iter + 1):
        run_step()
        log.after_step(completed, scheduler)
        scheduler.step()
        if use_graph:
            _keep_lr_tensor(optimizer, lr_tensors)
    if step.average is not None:
        step.average.copy_to_params()
    optimizer.zero_grad(set_to_none=True)
    candidates.write_back()
    for model in models:
        model.eval()
    return log.histories, config.max_iter, log.failed()


def _decay_scales(model, config):
    """Each parameter's name and its L2 scale (0 for biases), as a fit decays it."""
    weights, scales = weight_tensors(model, config.l2_scale, config.logit_l2_scale)
    scale_of = {
        id(weight): scale for weight, scale in zip(weights, scales, strict=True)
    }
    return {name: scale_of.get(id(p), 0.0) for name, p in model.named_parameters()}


class _StreamCandidates:
    """The K models apart; on a GPU each computes on a CUDA stream of its own."""

    def __init__(self, models, config, device):
        self.models = models
        self.precision = config.precision
        self.device = device
        self.params = [p for model in models for p in model.parameters()]
        self.groups = {}
        for model in models:
            params = dict(model.named_parameters())
            for name, scale in _decay_scales(model, config).items():
                self.groups.setdefault(scale, []).append(params[name])
        # Streams of this fit's own: the candidates' branches must not
        # share a stream with anything else captured meanwhile.
        self.streams = (
            [torch.cuda.Stream(device) for _ in models]
            if device.type == "cuda"
            else None
        )

    def input_format(self, batch):
        return self.models[0].input_format(batch)

    def train_terms(self, x, labels, weights, scale, losses):
        """Each candidate's loss terms, its backward pass run; (K, n_terms).

        ``losses`` is ``(n_batch, loss)``: the rows before the second view
        and the candidates' :class:`~skassoc._engine._loss_terms.StepLoss`.
        """
        args = (x, labels, weights, scale, losses)
        if self.streams is None:
            return torch.stack([self._one(k, *args) for k in range(len(self.models))])
        caller = torch.cuda.current_stream(self.device)
        terms = []
        for k, stream in enumerate(self.streams):
            stream.wait_stream(caller)
            # x is freed on the caller's stream: its memory must not be
            # reused before this stream's kernels have read it.
            x.record_stream(stream)
            with torch.cuda.stream(stream):
                terms.append(self._one(k, *args))
        for stream in self.streams:
            caller.wait_stream(stream)
        return torch.stack(terms)

    def _one(self, k, x, labels, weights, scale, losses):
        model = self.models[k]
        with autocast_context(self.device, self.precision):
            embeddings = model.embedder(x)
            logits = model.logits(embeddings[: labels.shape[0]])
        n_batch, loss = losses
        terms = loss(embeddings, logits, labels, n_batch, weights[k], scale)
        terms[0].backward()
        return terms.detach()

    def write_back(self):
        """The models already hold their weights."""


class _VmapCandidates:
    """The K models' parameters stacked; one network call vectorised over them."""

    def __init__(self, models, config, device):
        self.models = models
        self.template = models[0]
        self.precision = config.precision
        self.device = device
        self.stacked, self.buffers = torch.func.stack_module_state(models)
        self.params = list(self.stacked.values())
        self.groups = {}
        for name, scale in _decay_scales(self.template, config).items():
            self.groups.setdefault(scale, []).append(self.stacked[name])
        self.vmapped = torch.vmap(
            self._candidate, in_dims=(0, 0, 0, None, None, None, None)
        )

    def input_format(self, batch):
        return self.template.input_format(batch)

    def _candidate(self, params, buffers, weights, x, labels, scale, losses):
        state = {**params, **buffers}
        embedder = {k[9:]: v for k, v in state.items() if k.startswith("embedder.")}
        logit_layer = {k[7:]: v for k, v in state.items() if k.startswith("logits.")}
        call = torch.func.functional_call
        with autocast_context(self.device, self.precision):
            embeddings = call(self.template.embedder, embedder, (x,))
            logits = call(
                self.template.logits, logit_layer, (embeddings[: labels.shape[0]],)
            )
        n_batch, loss = losses
        return loss(embeddings, logits, labels, n_batch, weights, scale)

    def train_terms(self, x, labels, weights, scale, losses):
        """Each candidate's loss terms, the backward pass of their sum run;
        (K, n_terms). ``losses`` as for :meth:`_StreamCandidates.train_terms`."""
        terms = self.vmapped(
            self.stacked, self.buffers, weights, x, labels, scale, losses
        )
        # The candidates share no parameter: the sum's gradient with respect
        # to candidate k's weights is that of candidate k's total.
        terms[:, 0].sum().backward()
        return terms.detach()

    @torch.no_grad()
    def write_back(self):
        """Copy each candidate's slice of the stacked tensors into its model."""
        for k, model in enumerate(self.models):
            for name, tensor in model.named_parameters():
                tensor.copy_(self.stacked[name][k])
            for name, tensor in model.named_buffers():
                tensor.copy_(self.buffers[name][k])


class _StackedStep:
    """One step of all candidates, on device tensors; capturable as a CUDA graph."""

    def __init__(self, candidates, batches, optimizer, configs, device):
        config = configs[0]
        self.candidates = candidates
        self.batches = batches
        self.optimizer = optimizer
        self.config = config
        layout = step_batch_layout(config, device, candidates.models[0].embedder)
        self.memory_format, self.augment, self.augment_unlabeled = layout
        # The terms that any candidate turns on; a candidate weighs the
        # others at 0.
        terms = active_terms(*(c.loss_weights for c in configs))
        self.loss = StepLoss(terms, class_frequencies(config, batches, terms))
        self.loss_names = self.loss.names
        # (K, n_terms) loss weights, read on the device.
        self.weights = torch.tensor(
            [self.loss.weights(c.loss_weights) for c in configs], device=device
        )
        self.average = (
            WeightAverage(candidates.params, config.ema_decay)
            if config.ema_decay is not None
            else None
        )
        k = len(configs)
        self.step_count = torch.zeros((), device=device)
        self.loss_sum = torch.zeros(k, len(self.loss_names), device=device)
        self.first_nonfinite_step = torch.full((k,), -1.0, device=device)

    def prefetch(self):
        """Host work that must precede the next step (see ``_batches``)."""
        self.batches.prefetch()

    def association_scale(self):
        """Delay, then ramp, as a single fit does."""
        return association_scale(self.step_count, self.config)

    def shared_batch(self):
        """The step's batch, augmented as a single fit augments it, formatted,
        and its rows before the consistency loss's second copy."""
        batch = self.batches.batch()
        n_batch = batch.shape[0]
        batch = augment_batch(
            batch,
            self.batches.labels.shape[0],
            self.augment,
            self.augment_unlabeled,
            "second_view" in self.loss.needs,
        )
        batch = self.candidates.input_format(batch)
        return batch.contiguous(memory_format=self.memory_format), n_batch

    def __call__(self):
        x, n_batch = self.shared_batch()
        labels = self.batches.labels
        self.optimizer.zero_grad(set_to_none=True)
        losses = n_batch, self.loss
        terms = self.candidates.train_terms(
            x, labels, self.weights, self.association_scale(), losses
        )
        self.optimizer.step()
        if self.average is not None:
            self.average.update()
        bad = (self.first_nonfinite_step < 0) & ~torch.isfinite(terms).all(dim=1)
        self.first_nonfinite_step.copy_(
            torch.where(bad, self.step_count, self.first_nonfinite_step)
        )
        self.loss_sum.add_(terms)
        self.step_count.add_(1)


class _StackedLog:
    """Each candidate's loss history, read back every ``log_interval`` steps."""

    def __init__(self, step, config):
        self.step = step
        self.config = config
        k = step.loss_sum.shape[0]
        self.histories = [
            {name: [] for name in ("step", "learning_rate", *step.loss_names)}
            for _ in range(k)
        ]
        self.logged_until = 0

    def after_step(self, completed, scheduler):
        """Record the losses when due (before ``scheduler`` steps)."""
        if completed % self.config.log_interval and completed != self.config.max_iter:
            return
        n_steps = completed - self.logged_until
        sums = (self.step.loss_sum / n_steps).tolist()
        self.step.loss_sum.zero_()
        learning_rate = float(_learning_rate(scheduler))
        for history, means in zip(self.histories, sums, strict=True):
            history["step"].append(completed)
            history["learning_rate"].append(learning_rate)
            for name, value in zip(self.step.loss_names, means, strict=True):
                history[name].append(value)
        self.logged_until = completed

    def failed(self):
        """Candidates whose loss became NaN or infinite."""
        first = self.step.first_nonfinite_step.cpu().numpy()
        return set(np.flatnonzero(first >= 0).tolist())
