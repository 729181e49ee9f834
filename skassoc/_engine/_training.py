"""The training loop: one association step, run eagerly or as a CUDA graph.

The step (sampling, forward, the losses, backward, the Adam update) touches
only device tensors and never reads a value back to the host, so on a GPU it
is captured once as a CUDA graph and replayed: at the paper's batch sizes an
eager step is bound by kernel launches, not by the GPU. Loss values are summed
on the device and read back every ``log_interval`` steps.
"""

import contextlib
import importlib
import math
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import torch
from sklearn.exceptions import ConvergenceWarning
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from .._nn._networks import weight_tensors
from .._utils import user_stacklevel
from ._augmentation import augmentation_module
from ._best_weights import BestWeights
from ._device import autocast_context, borrowed_streams, cuda_rng_lock, own_stream
from ._ema import WeightAverage
from ._loss_terms import ClassFrequencies, StepLoss, active_terms, needs_of

__all__ = [
    "TrainingConfig",
    "TrainingResult",
    "train",
    "NonFiniteLossError",
    "embedding_chunk_size",
]

#: The values of the estimator's ``lr_schedule`` (see LearningRateFactor).
LR_SCHEDULES = ("step", "cosine")

# Eager steps run before capture: they let cuDNN pick its kernels and the
# optimizer create its state, and they are real training steps.
_GRAPH_WARMUP_STEPS = 3


@dataclass
class TrainingConfig:
    """Hyperparameters of one training run (see the estimator for meanings)."""

    max_iter: int
    learning_rate: float
    lr_decay: float
    lr_decay_steps: int
    lr_schedule: str
    lr_warmup_steps: int
    # Each registered loss term's weight, by its parameter's name (see
    # skassoc._engine._loss_terms); consistency_weight already resolved.
    loss_weights: dict
    association_delay: int
    association_ramp_steps: int
    l2_scale: float
    logit_l2_scale: float
    precision: str
    cuda_graph: bool
    channels_last: bool
    log_interval: int
    verbose: int
    augmentation: dict | None = None
    # Given class frequencies (None: the paper's visit loss, and the balance
    # loss aims at the labels' shares); see class_frequencies.
    class_prior: tuple | None = None
    ema_decay: float | None = None
    embedding_chunk_size: int | None = 4096
    validation_interval: int | None = None
    compile: dict | None = None
    # With a validation scorer: stop after n_iter_no_change validations
    # without a gain of tol, and keep the best-scoring weights.
    early_stopping: bool = False
    n_iter_no_change: int = 10
    tol: float = 1e-4

    @property
    def second_view(self):
        """Whether a loss term that is on embeds a second view of the
        unlabeled batch (the consistency loss)."""
        return "second_view" in needs_of(active_terms(self.loss_weights))


@dataclass
class TrainingResult:
    """What a run did: steps completed, loss history, whether it was cut short."""

    n_iter: int
    history: dict = field(default_factory=dict)
    interrupted: bool = False
    best_step: int | None = None


class NonFiniteLossError(FloatingPointError):
    """Raised when a training loss becomes NaN or infinite."""


def association_scale(step_count, config):
    """Multiplier of the association losses at (0-based) ``step_count``.

    Zero until ``config.association_delay``, then ramped up linearly over
    ``config.association_ramp_steps`` (or switched on at once). A device
    tensor in, a device tensor out: no host sync inside the step.
    """
    if config.association_ramp_steps > 0:
        ramp = (step_count - config.association_delay + 1) / (
            config.association_ramp_steps
        )
        return ramp.clamp(0.0, 1.0)
    return (step_count >= config.association_delay).float()


def embedding_chunk_size(model, config):
    """The most samples ``model`` embeds at once in a step (None: no limit).

    ``config.embedding_chunk_size``, except for a network with batch norm,
    which is never chunked: its batch statistics would change with the
    chunking (see ``_AssociationStep.embed``).
    """
    has_batch_norm = any(
        isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
        for module in model.modules()
    )
    return None if has_batch_norm else config.embedding_chunk_size


def step_batch_layout(config, device, embedder):
    """How a training step lays out its batches: the memory format, the
    augmentation module (None without augmentation) and whether it also
    augments the unlabeled batch. ``embedder`` is the network (the feature
    noise reads its feature scale)."""
    memory_format = (
        torch.channels_last if config.channels_last else torch.contiguous_format
    )
    if config.augmentation is None:
        return memory_format, None, False
    module, augments_unlabeled = augmentation_module(config.augmentation, embedder)
    return memory_format, module.to(device), augments_unlabeled


def class_frequencies(config, batches, terms=None):
    """The :class:`~skassoc._engine._loss_terms.ClassFrequencies` of a fit's steps.

    Given class frequencies (``config.class_prior``) are the balance loss's
    target and weigh the visit loss's walks; otherwise the balance loss
    aims at each class's share of the labeled training samples. The shares
    and their running estimate are made only where one of ``terms`` (by
    default those that ``config`` turns on) needs class frequencies.
    """
    labels = batches.labels
    start_weights = visit_start_weights(config.class_prior, labels)
    if terms is None:
        terms = active_terms(config.loss_weights)
    if "class_frequencies" not in needs_of(terms):
        return ClassFrequencies(visit_start_weights=start_weights)
    if config.class_prior is None:
        shares = batches.sampler.class_shares().to(labels.device)
    else:
        shares = torch.tensor(config.class_prior, device=labels.device).float()
    return ClassFrequencies(
        class_shares=shares,
        # The estimate starts at the shares: no pull before the walks say
        # where the classes' mass goes.
        class_mass=shares.clone(),
        visit_start_weights=start_weights,
    )


def visit_start_weights(class_prior, labels):
    """Start weights of the visit loss for a labeled batch of classes ``labels``.

    Each class's walks start at its samples of the batch equally often, and
    the class takes its frequency in ``class_prior`` of them (float64). None,
    or equal frequencies, leave the paper's equal weights (None).
    """
    if class_prior is None or len(set(class_prior)) == 1:
        return None
    frequencies = torch.tensor(class_prior, dtype=torch.float64, device=labels.device)
    in_batch = torch.bincount(labels, minlength=len(frequencies)).double()
    return frequencies[labels] / in_batch[labels]


def augment_batch(batch, n_labeled, augment, augment_unlabeled, second_view):
    """The step's batch, augmented; with ``second_view``, followed by a
    second augmented copy of its unlabeled rows (for the consistency loss).

    The labeled rows come first (see ``_batches``). ``augment`` None leaves
    the batch as it is.
    """
    if augment is None:
        return batch
    unlabeled = batch[n_labeled:]
    if augment_unlabeled:
        batch = augment(batch)
    else:
        batch = torch.cat([augment(batch[:n_labeled]), unlabeled])
    if second_view:
        # Augmented independently of the first view, and drawn after it:
        # fits without the consistency loss keep their random stream. It is
        # embedded in the same pass.
        batch = torch.cat([batch, augment(unlabeled)])
    return batch


class _AssociationStep:
    """One training step on device-resident tensors; safe to capture as a graph.

    The host may need to stage the batch first: call :meth:`prefetch` before
    every step (outside a captured graph).
    """

    def __init__(self, model, batches, optimizer, config, device):
        self.model = model
        self.batches = batches
        self.optimizer = optimizer
        self.config = config
        self.device = device
        layout = step_batch_layout(config, device, model.embedder)
        self.memory_format, self.augment, self.augment_unlabeled = layout
        terms = active_terms(config.loss_weights)
        self.loss = StepLoss(terms, class_frequencies(config, batches, terms))
        # Python floats: a captured graph holds them as constants.
        self.weights = self.loss.weights(config.loss_weights)
        self.loss_names = self.loss.names
        # The consistency loss embeds a second view of the unlabeled batch.
        self.second_view = "second_view" in self.loss.needs
        if self.second_view and config.augmentation is None:
            # The estimator refuses this earlier, with advice; this guards
            # direct use of the training loop.
            raise ValueError(
                "A loss term that needs a second view of the unlabeled batch "
                "(consistency_weight > 0) needs an augmentation."
            )
        self.params = list(model.parameters())
        self.chunk_size = embedding_chunk_size(model, config)
        # The compiled pass is built here, before any step: bad options fail
        # the fit before training. It compiles at its first call (the first
        # warm-up step), and a network of the same structure in a later fit
        # reuses that compilation.
        self.embed_batch = model.embed
        if config.compile is not None:
            self.embed_batch = torch.compile(model.embed, **config.compile)
            n_unlabeled = batches.sampler.unlabeled_batch_size
            n_views = 2 if self.second_view else 1
            rows = batches.labels.shape[0] + n_views * n_unlabeled
            if self.chunk_size is not None and rows > self.chunk_size:
                warnings.warn(
                    f"compile has no effect on this fit: its batch of {rows} "
                    f"samples is embedded in chunks of {self.chunk_size}, which "
                    "run uncompiled. Leave compile off, or use a smaller "
                    "unlabeled_batch_size.",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
        # A moving average of the weights, updated inside the step (so
        # inside the CUDA graph); the model takes it at the end.
        self.average = (
            WeightAverage(self.params, config.ema_decay)
            if config.ema_decay is not None
            else None
        )
        # Device-side counters, so neither the weight ramp nor the loss
        # bookkeeping needs the host.
        self.step_count = torch.zeros((), device=device)
        self.loss_sum = torch.zeros(len(self.loss_names), device=device)
        self.first_nonfinite_step = torch.full((), -1.0, device=device)

    def prefetch(self):
        """Host work that must precede the next step (see ``_batches``)."""
        self.batches.prefetch()

    def embed(self, batch):
        """Embeddings of the batch; a large batch is embedded chunk by chunk.

        Above ``config.embedding_chunk_size`` samples, each chunk's
        activations are dropped after its forward pass and recomputed in the
        backward pass (activation checkpointing): an unlabeled batch of tens
        of thousands of images then needs the activation memory of one
        chunk, for about a third more compute. Networks with batch norm are
        never chunked: their statistics would change with the chunking.
        """
        chunk = self.chunk_size
        if chunk is None or batch.shape[0] <= chunk:
            return self.embed_batch(batch, self.memory_format)
        return torch.cat(
            [
                # The network draws no random numbers (augmentation happened
                # before), so no RNG state needs saving; that also keeps the
                # step capturable as a CUDA graph.
                checkpoint(
                    self.model.embed,
                    part,
                    self.memory_format,
                    use_reentrant=False,
                    preserve_rng_state=False,
                )
                for part in batch.split(chunk)
            ]
        )

    def association_scale(self):
        """Multiplier of the association loss terms (their delay and ramp)."""
        return association_scale(self.step_count, self.config)

    def use_average_weights(self):
        """Make the moving average of the weights the model's, if kept."""
        if self.average is not None:
            self.average.copy_to_params()

    def fitted_weights(self):
        """The weights the model would be fitted with if training ended now.

        With a moving average kept, its weights stand in for the current ones
        until the context ends.
        """
        if self.average is None:
            return contextlib.nullcontext()
        return self.average.swapped_in()

    def __call__(self):
        config = self.config
        labels = self.batches.labels
        n_labeled = labels.shape[0]
        batch = self.batches.batch()
        n_batch = batch.shape[0]
        batch = augment_batch(
            batch,
            n_labeled,
            self.augment,
            self.augment_unlabeled,
            self.second_view,
        )
        with autocast_context(self.device, config.precision):
            embeddings = self.embed(batch)
            logits = self.model.logits(embeddings[:n_labeled])
        terms = self.loss(
            embeddings,
            logits,
            labels,
            n_batch,
            self.weights,
            self.association_scale(),
            labeled_weights=self.batches.labeled_weights(),
        )
        self.optimizer.zero_grad(set_to_none=True)
        terms[0].backward()
        self.optimizer.step()
        if self.average is not None:
            self.average.update()

        terms = terms.detach()
        bad = (self.first_nonfinite_step < 0) & ~torch.isfinite(terms).all()
        self.first_nonfinite_step.copy_(
            torch.where(bad, self.step_count, self.first_nonfinite_step)
        )
        self.loss_sum.add_(terms)
        self.step_count.add_(1)


def _parameter_groups(model, config):
    """Adam parameter groups carrying the paper's L2 penalty as weight decay.

    Adam's (coupled) ``weight_decay`` adds ``scale * w`` to the gradient,
    which is exactly the gradient of the paper's ``scale * sum(w**2) / 2``
    term (:func:`skassoc._engine._losses.l2_penalty`), without the dozens of small
    kernels that computing the term in the loss costs every step.
    """
    weights, scales = weight_tensors(model, config.l2_scale, config.logit_l2_scale)
    decayed = {id(weight) for weight in weights}
    groups = {}
    for weight, scale in zip(weights, scales):
        groups.setdefault(scale, []).append(weight)
    undecayed = [p for p in model.parameters() if id(p) not in decayed]
    groups = [
        {"params": params, "weight_decay": scale} for scale, params in groups.items()
    ]
    if undecayed:
        groups.append({"params": undecayed, "weight_decay": 0.0})
    return groups


def load_torch_dynamo():
    """Import ``torch._dynamo`` whole, holding back a Ctrl-C until it is done.

    torch imports it, and sympy with it, lazily: the first time a process
    builds an optimizer or runs a network on the meta device, early in its
    first fit, and it is a large import. One cut short leaves the
    submodules it had finished in ``sys.modules`` but not bound to their
    package, and every later import of ``torch._dynamo`` in the process
    fails (``module 'sympy' has no attribute 'printing'``). So an interrupt
    that comes during the import is delivered once it has ended.

    Raises
    ------
    RuntimeError
        If the import fails where an earlier one, outside skassoc, was cut
        short (it left parts of ``torch._dynamo`` or sympy in
        ``sys.modules``): only a new Python process imports it again. Any
        other failure propagates as it is.
    """
    if "torch._dynamo" in sys.modules:
        return
    # Taken before the import, which itself leaves its finished submodules
    # behind when it fails for another reason.
    leftovers = _half_imported_modules()
    try:
        with _sigint_held_back():
            importlib.import_module("torch._dynamo")
    except Exception as exc:
        if not leftovers:
            raise
        raise RuntimeError(
            "torch cannot import torch._dynamo, which its optimizers use "
            f"({type(exc).__name__}: {exc}). An earlier import of it (or of "
            "sympy) in this Python process was interrupted, e.g. by a Ctrl-C, "
            f"and left modules half imported ({', '.join(leftovers[:3])}). "
            "Restart the Python process (or the notebook's kernel) and fit again."
        ) from exc


def _half_imported_modules():
    """The modules that a cut-short import of ``torch._dynamo`` left behind.

    Submodules of ``torch._dynamo`` without the package itself, or sympy
    submodules without sympy or not bound to it (its attribute missing): an
    import that ended normally leaves neither.
    """
    dynamo = sorted(name for name in sys.modules if name.startswith("torch._dynamo."))
    sympy = sys.modules.get("sympy")
    parts = {name.split(".")[1] for name in sys.modules if name.startswith("sympy.")}
    unbound = sorted(
        f"sympy.{part}" for part in parts if sympy is None or not hasattr(sympy, part)
    )
    return dynamo + unbound


@contextlib.contextmanager
def _sigint_held_back():
    """Deliver a Ctrl-C (SIGINT) that comes during the block when it ends."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if in_main_thread else None
    if previous is None:
        # Python runs signal handlers in the main thread only, so no other
        # thread is interrupted; a handler set outside Python (None) cannot
        # be put back.
        yield
        return
    received = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)


def make_optimizer(groups, learning_rate, device, capturable):
    """Adam over parameter ``groups``; ``capturable`` for a CUDA graph."""
    # Adam's first use imports torch._dynamo: whole, even on a Ctrl-C.
    load_torch_dynamo()
    if capturable:
        # A tensor learning rate is read by the captured graph on every replay;
        # the scheduler updates it in place.
        # The fused kernel updates every parameter in one launch.
        return torch.optim.Adam(
            groups,
            lr=torch.tensor(learning_rate, device=device),
            capturable=True,
            fused=True,
        )
    return torch.optim.Adam(groups, lr=learning_rate)


class LearningRateFactor:
    """The learning rate's multiplier at each (0-based) step of a run.

    A linear warm-up, ``(step + 1) / lr_warmup_steps`` over the first
    ``lr_warmup_steps`` steps, times ``"step"``: a factor of ``lr_decay``
    every ``lr_decay_steps`` steps counted from step 0 (the paper's
    schedule), or ``"cosine"``: half a cosine from 1 after the warm-up down
    to 0 at step ``max_iter``, one step after the last.
    """

    def __init__(self, config):
        self.schedule = config.lr_schedule
        self.warmup_steps = config.lr_warmup_steps
        self.decay, self.decay_steps = config.lr_decay, config.lr_decay_steps
        self.max_iter = config.max_iter

    def __call__(self, step):
        warmup = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        if self.schedule == "cosine":
            after_warmup = max(0, step - self.warmup_steps)
            progress = after_warmup / max(1, self.max_iter - self.warmup_steps)
            return warmup * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return warmup * self.decay ** (step // self.decay_steps)


def make_scheduler(optimizer, config):
    """torch's ``LambdaLR`` following :class:`LearningRateFactor`."""
    factor = LearningRateFactor(config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    # Before torch 2.4 the scheduler keeps the optimizer's tensor rate itself as
    # its base rate (pytorch#126854), and _keep_lr_tensor writes each step's
    # rate into that tensor: the factors would compound. Plain floats do not.
    scheduler.base_lrs = [float(rate) for rate in scheduler.base_lrs]
    return scheduler


def _keep_lr_tensor(optimizer, lr_tensors):
    """Older torch schedulers replace a tensor lr by a new object; copy it back."""
    for group, lr in zip(optimizer.param_groups, lr_tensors, strict=True):
        if group["lr"] is not lr:
            lr.fill_(float(group["lr"]))
            group["lr"] = lr


def _capture(step, stream):
    """Capture one training step as a CUDA graph, on ``stream``.

    The step must have run eagerly a few times first (the warm-up), on a
    side stream: that allocates the optimizer state and lets cuDNN pick
    its kernels outside the capture.
    """
    step.optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    # A capture stream of this fit's own (torch.cuda.graph's default one is
    # shared by all threads), and "thread_local" mode: fits in other threads
    # (GridSearchCV under the threading backend) may use CUDA meanwhile.
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        step()
    return graph


def train(model, batches, config, device, evaluate=None):
    """Train ``model`` in place with the association losses.

    Parameters
    ----------
    model : AssociationModel
        The network, already on ``device``.
    batches : DeviceBatches or HostBatches
        Draws and gathers the labeled and unlabeled batches (``_batches``).
    config : TrainingConfig
        The run's hyperparameters.
    device : torch.device
        Where training runs.
    evaluate : callable, optional
        Called without arguments every ``config.validation_interval`` steps
        and after the last step, with the model in eval mode and holding the
        weights it would be fitted with at that step; returns a score that
        goes to the history as ``"validation_score"`` (the steps as
        ``"validation_step"``). It must not change the model. With
        ``config.early_stopping``, training stops after
        ``config.n_iter_no_change`` scores without a gain of ``config.tol``
        and the model ends with the best-scoring weights.

    Returns
    -------
    result : TrainingResult
        Steps completed and the loss history (means over each
        ``log_interval`` steps).

    Raises
    ------
    NonFiniteLossError
        If a loss becomes NaN or infinite; the model is then in an undefined
        state and the caller must discard it.
    KeyboardInterrupt
        If interrupted before the first step completed (nothing was learned).
        An interrupt after that ends training early instead and returns the
        model of the steps completed (``TrainingResult.interrupted``); the
        caller keeps it and raises the interrupt again.
    """
    if device.type != "cuda":
        return _train(model, batches, config, device, None, evaluate)
    with borrowed_streams(device) as streams, own_stream(device, streams[0]):
        return _train(model, batches, config, device, streams, evaluate)


class _StepRunner:
    """Runs training steps: eagerly, or replaying one captured CUDA graph.

    A graph is captured after a few eager steps on a side stream (they let
    cuDNN pick its kernels and the optimizer create its state, and they are
    real training steps).
    """

    def __init__(self, step, device, streams, use_graph):
        self.step = step
        self.lock = cuda_rng_lock(device)
        self.streams = streams
        self.use_graph = use_graph
        self.graph = None
        self.eager_steps = 0

    def __call__(self):
        self.step.prefetch()
        with self.lock:
            if not self.use_graph:
                self.step()
            elif self.eager_steps < _GRAPH_WARMUP_STEPS:
                self._eager_on_side_stream()
            else:
                if self.graph is None:
                    self.graph = _capture(self.step, self.streams[2])
                self.graph.replay()

    def _eager_on_side_stream(self):
        side = self.streams[1]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.eager_steps += 1


class _TrainingLog:
    """The history of a run and its progress bar.

    Loss sums stay on the device and are read back every ``log_interval``
    steps (one host synchronisation each time).
    """

    def __init__(self, step, config, evaluate):
        self.step = step
        self.config = config
        self.evaluate = evaluate
        self.history = {"step": [], "learning_rate": []}
        self.history.update({name: [] for name in step.loss_names})
        if evaluate is not None:
            self.history["validation_step"] = []
            self.history["validation_score"] = []
        self.best = (
            BestWeights(step.model, config.n_iter_no_change, config.tol)
            if evaluate is not None and config.early_stopping
            else None
        )
        self.logged_until = 0
        self.started = time.perf_counter()
        # The bar stays on screen when training ends: it is the record of
        # what the fit did (steps, time, last losses).
        self.progress = tqdm(
            total=config.max_iter, disable=not config.verbose, desc="skassoc"
        )

    def after_step(self, completed, scheduler):
        """Record what is due after step ``completed`` (1-based).

        Called before ``scheduler`` steps, so it holds that step's rate.
        Returns whether early stopping ends training after this step.
        """
        last = completed == self.config.max_iter
        if completed % self.config.log_interval == 0 or last:
            self.read_losses(completed, _learning_rate(scheduler))
        stop = False
        if self.evaluate is not None and (
            completed % self.config.validation_interval == 0 or last
        ):
            stop = self.validate(completed)
        if stop:
            self.read_losses(completed, _learning_rate(scheduler))
        return stop

    def read_losses(self, completed, learning_rate):
        """Move the loss sums since the last read into the history."""
        n_steps = completed - self.logged_until
        if n_steps <= 0:
            return
        step = self.step
        sums = step.loss_sum.tolist()
        first_bad = int(step.first_nonfinite_step.item())
        if first_bad >= 0:
            raise NonFiniteLossError(
                f"The training loss became NaN or infinite at step {first_bad + 1}. "
                "The learning rate is likely too high for this data, or the "
                "inputs are on an extreme scale (for a custom network, scale "
                "them first); lower learning_rate or rescale X."
            )
        entry = {"step": completed, "learning_rate": float(learning_rate)}
        entry.update(
            zip(step.loss_names, (value / n_steps for value in sums), strict=True)
        )
        self._append(entry, logged_until=completed)
        # Zeroed once the entry is in: the interrupt handler reads the losses
        # of steps past ``logged_until`` again, and must not find zeros.
        step.loss_sum.zero_()
        self.progress.update(n_steps)
        self._show()

    def _append(self, entry, logged_until=None):
        """Append ``entry`` (a value per history list) whole, or not at all.

        A KeyboardInterrupt between two appends would leave the lists of
        unequal lengths, and one before ``logged_until`` is set would have the
        interrupt handler of ``_train`` log the same steps a second time; so
        an error anywhere in here takes back what was appended, and the
        handler logs these steps again from the loss sums.
        """
        lengths = {name: len(self.history[name]) for name in entry}
        previous = self.logged_until
        try:
            for name, value in entry.items():
                self.history[name].append(value)
            if logged_until is not None:
                self.logged_until = logged_until
        except BaseException:
            for name, length in lengths.items():
                del self.history[name][length:]
            self.logged_until = previous
            raise

    def validate(self, completed):
        """Score the weights the model would be fitted with after ``completed``.

        With early stopping, keeps a copy of them if they score best, and
        returns whether training should stop.
        """
        model = self.step.model
        stop = False
        with self.step.fitted_weights():
            model.eval()
            try:
                score = float(self.evaluate())
                # A Ctrl-C here would leave a half-made copy of the weights to
                # be restored, or best weights whose score is not in the
                # history: it is delivered once both are done.
                with _sigint_held_back():
                    if self.best is not None:
                        stop = self.best.update(score, completed)
                    entry = {"validation_step": completed, "validation_score": score}
                    self._append(entry)
            finally:
                model.train()
        self._show()
        return stop

    def _show(self):
        if not self.config.verbose:
            return
        # A validation may come before the first losses are read back.
        shown = {
            name: self.history[name][-1]
            for name in self.step.loss_names
            if self.history[name]
        }
        if self.config.verbose >= 2 and self.history["learning_rate"]:
            shown["lr"] = self.history["learning_rate"][-1]
            if self.history.get("validation_score"):
                shown["val"] = self.history["validation_score"][-1]
        self.progress.set_postfix(
            {name: f"{value:.3g}" for name, value in shown.items()}, refresh=False
        )

    def close(self):
        self.progress.close()


def _learning_rate(scheduler):
    """The scheduler's current rate as a float (a tensor rate is read back)."""
    return float(scheduler.get_last_lr()[0])


def _train(model, batches, config, device, streams, evaluate):
    model.train()
    use_graph = config.cuda_graph and device.type == "cuda"
    optimizer = make_optimizer(
        _parameter_groups(model, config), config.learning_rate, device, use_graph
    )
    lr_tensors = [group["lr"] for group in optimizer.param_groups]
    scheduler = make_scheduler(optimizer, config)
    step = _AssociationStep(model, batches, optimizer, config, device)
    run_step = _StepRunner(step, device, streams, use_graph)
    log = _TrainingLog(step, config, evaluate)
    completed, interrupted = 0, False
    try:
        while completed < config.max_iter:
            run_step()
            completed += 1
            stop = log.after_step(completed, scheduler)
            scheduler.step()
            if use_graph:
                _keep_lr_tensor(optimizer, lr_tensors)
            if stop:
                break
    except KeyboardInterrupt:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if completed == 0:
            raise
        interrupted = True
        # The losses of the steps that did complete are still worth keeping;
        # a loss that went non-finite before the interrupt still raises.
        log.read_losses(completed, _learning_rate(scheduler))
    finally:
        log.close()
    step.use_average_weights()
    best_step = None
    if log.best is not None:
        # The best-scoring weights (the averaged ones with ema_decay).
        log.best.restore()
        best_step = log.best.best_step
    # The last step's gradients are of no use to the fitted model.
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return TrainingResult(
        n_iter=completed,
        history=log.history,
        interrupted=interrupted,
        best_step=best_step,
    )


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


def default_log_interval(max_iter):
    """Read losses back about 100 times a run, at most every 10 steps."""
    return max(10, math.ceil(max_iter / 100))
