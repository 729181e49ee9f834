"""The training loop: one association step, run eagerly or as a CUDA graph.

The step (sampling, forward, the losses, backward, the Adam update) touches
only device tensors and never reads a value back to the host, so on a GPU it
is captured once as a CUDA graph and replayed: at the paper's batch sizes an
eager step is bound by kernel launches, not by the GPU. Loss values are summed
on the device and read back every ``log_interval`` steps.
"""

import contextlib
import math
import queue
import threading
import warnings
from dataclasses import dataclass, field

import torch
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from ._augmentation import ImageAugmentation
from ._losses import (
    association_matrices,
    backward_transitions,
    classification_loss,
    consistency_loss,
    visit_loss,
    walker_class_probabilities,
    walker_loss,
)
from ._networks import weight_tensors
from ._validation import user_stacklevel

__all__ = [
    "TrainingConfig",
    "TrainingResult",
    "train",
    "precision_context",
    "seeded_rng",
]

LOSS_NAMES = ("total", "walker", "visit", "logit")
# Recorded only by fits with consistency_weight > 0.
CONSISTENCY = "consistency"

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
    walker_weight: float
    visit_weight: float
    logit_weight: float
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
    consistency_weight: float = 0.0
    ema_decay: float | None = None
    embedding_chunk_size: int | None = 4096
    validation_interval: int | None = None
    compile: dict | None = None


@dataclass
class TrainingResult:
    """What a run did: steps completed, loss history, whether it was cut short."""

    n_iter: int
    history: dict = field(default_factory=dict)
    interrupted: bool = False


class NonFiniteLossError(FloatingPointError):
    """Raised when a training loss becomes NaN or infinite."""


# Every fit draws its batches from torch's global CUDA generator, and CUDA
# graphs put that generator in a capture state: while one thread captures a
# step, any other use of the generator (an eager step, a replay, a reseed) in
# another thread fails, and so does a device-wide synchronisation (cuDNN
# autotuning a new shape does one). Fits and predictions in threads
# (GridSearchCV under joblib's threading backend) therefore take this lock
# for capture, for each launch and for inference; a replay only enqueues
# work, so holding the lock for it costs microseconds and the GPU still runs
# the fits' steps side by side.
_CUDA_RNG_LOCK = threading.RLock()


# torch.cuda.Stream() hands out the streams of a fixed pool in turn (32 per
# device), so a fit that took new streams could get one still in use by a
# long fit in another thread, and capture that fit's work into its graph.
# Fits therefore borrow one of ten fixed sets of three streams (30 of the
# 32), taken from the pool once per device; an eleventh concurrent fit on
# one device waits for a set to come back.
MAX_CONCURRENT_CUDA_FITS = 10
_STREAM_SETS = {}
_STREAM_SETS_LOCK = threading.Lock()
# The set a thread holds, per device: a fit started inside another fit of
# the same thread reuses it instead of waiting for one of its own.
_HELD_STREAMS = threading.local()


@contextlib.contextmanager
def borrowed_streams(device):
    """Streams for one fit on ``device``: (fit, warm-up, capture)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    held = getattr(_HELD_STREAMS, "by_device", None)
    if held is None:
        held = _HELD_STREAMS.by_device = {}
    if index in held:
        yield held[index]
        return
    with _STREAM_SETS_LOCK:
        free = _STREAM_SETS.get(index)
        if free is None:
            cuda = torch.device("cuda", index)
            # Registered only once all sets exist: a failure here must not
            # leave a short queue that later fits wait on forever.
            sets = [
                tuple(torch.cuda.Stream(cuda) for _ in range(3))
                for _ in range(MAX_CONCURRENT_CUDA_FITS)
            ]
            free = queue.LifoQueue()
            for streams in sets:
                free.put(streams)
            _STREAM_SETS[index] = free
    streams = None
    try:
        streams = held[index] = free.get()
        yield streams
    finally:
        held.pop(index, None)
        if streams is not None:
            free.put(streams)


def cuda_rng_lock(device):
    """``_CUDA_RNG_LOCK`` on a GPU; nothing on a CPU."""
    if device.type == "cuda":
        return _CUDA_RNG_LOCK
    return contextlib.nullcontext()


@contextlib.contextmanager
def seeded_rng(seed, device):
    """Seed torch's generators for one fit, then restore the caller's streams.

    Like ``torch.random.fork_rng``, but reads and sets the CUDA state under
    :func:`cuda_rng_lock`, so that it cannot meet another thread's capture.
    """
    with cuda_rng_lock(device):
        cpu_state = torch.get_rng_state()
        cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        torch.manual_seed(seed)
    try:
        yield
    finally:
        with cuda_rng_lock(device):
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, device)


def cpu_has_native_bf16():
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX)."""
    # torch exposes these checks only privately; without them, assume not.
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def autocast_context(device, precision):
    """Autocast for the network's forward pass (never for the losses)."""
    if precision != "bf16":
        return contextlib.nullcontext()
    # Cached casts would be freed under a CUDA graph's feet.
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


# The TF32 and cuDNN flags are process-wide. Fits and predictions in threads
# overlap, so the flags the caller had are saved by the first one to enter
# and restored by the last one to leave; in between, the latest to enter
# sets them (threads should therefore share one precision).
_PRECISION_LOCK = threading.Lock()
_precision_users = 0
_caller_flags = None


@contextlib.contextmanager
def precision_context(device, precision):
    """Set TF32 use for the duration of a fit or predict, then restore it.

    ``"fp32"`` turns TF32 off for matrix products and convolutions (PyTorch
    leaves it on for cuDNN convolutions by default); ``"tf32"`` and ``"bf16"``
    turn it on. cuDNN autotuning is enabled on CUDA: the step's shapes never
    change.
    """
    global _precision_users, _caller_flags
    if device.type != "cuda":
        yield
        return
    allow_tf32 = precision != "fp32"
    with _PRECISION_LOCK:
        matmul = torch.backends.cuda.matmul.allow_tf32
        # set_flags, as torch.backends.cudnn.flags() uses it: unlike setting
        # the attributes, it works after torch.backends.disable_global_flags().
        cudnn = torch.backends.cudnn.set_flags(
            _enabled=True, _benchmark=True, _deterministic=False, _allow_tf32=allow_tf32
        )
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        if _precision_users == 0:
            _caller_flags = (matmul, cudnn)
        _precision_users += 1
    try:
        yield
    finally:
        with _PRECISION_LOCK:
            _precision_users -= 1
            if _precision_users == 0:
                matmul, cudnn = _caller_flags
                torch.backends.cuda.matmul.allow_tf32 = matmul
                torch.backends.cudnn.set_flags(*cudnn)


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
        self.memory_format = (
            torch.channels_last if config.channels_last else torch.contiguous_format
        )
        self.augment, self.augment_unlabeled = None, False
        # The consistency loss embeds a second view of the unlabeled batch.
        self.with_consistency = config.consistency_weight > 0
        if self.with_consistency and config.augmentation is None:
            # The estimator refuses this earlier, with advice; this guards
            # direct use of the training loop.
            raise ValueError("consistency_weight > 0 needs an augmentation.")
        if config.augmentation is not None:
            settings = dict(config.augmentation)
            self.augment_unlabeled = settings.pop("unlabeled")
            self.augment = ImageAugmentation(**settings).to(device)
        self.params = list(model.parameters())
        has_batch_norm = any(
            isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
            for module in model.modules()
        )
        self.chunk_size = None if has_batch_norm else config.embedding_chunk_size
        # The compiled pass is built here, before any step: bad options fail
        # the fit before training. It compiles at its first call (the first
        # warm-up step), and a network of the same structure in a later fit
        # reuses that compilation.
        self.embed_batch = model.embed
        if config.compile is not None:
            self.embed_batch = torch.compile(model.embed, **config.compile)
            n_unlabeled = batches.sampler.unlabeled_batch_size
            n_views = 2 if self.with_consistency else 1
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
        # An exponential moving average of the weights, updated inside the
        # step (so inside the CUDA graph); the model takes it at the end.
        self.ema_params = (
            [param.detach().clone() for param in self.params]
            if config.ema_decay is not None
            else None
        )
        self._swapped_out = None
        # Device-side counters, so neither the weight ramp nor the loss
        # bookkeeping needs the host.
        self.loss_names = LOSS_NAMES
        if self.with_consistency:
            self.loss_names += (CONSISTENCY,)
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
        """Multiplier of the walker, visit and consistency losses.

        Zero until ``association_delay``, then ramped up (or switched on).
        """
        config = self.config
        if config.association_ramp_steps > 0:
            ramp = (self.step_count - config.association_delay + 1) / (
                config.association_ramp_steps
            )
            return ramp.clamp(0.0, 1.0)
        return (self.step_count >= config.association_delay).float()

    def use_average_weights(self):
        """Copy the moving average of the weights into the model, if kept."""
        if self.ema_params is not None:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.ema_params)

    @contextlib.contextmanager
    def fitted_weights(self):
        """The weights the model would be fitted with if training ended now.

        With a moving average kept, its weights stand in for the current ones
        until the context ends (copied in place: a captured graph holds the
        parameters' addresses).
        """
        if self.ema_params is None:
            yield
            return
        with torch.no_grad():
            # One buffer for the current weights, kept for the next swap.
            if self._swapped_out is None:
                self._swapped_out = [param.detach().clone() for param in self.params]
            else:
                torch._foreach_copy_(self._swapped_out, self.params)
            torch._foreach_copy_(self.params, self.ema_params)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self._swapped_out)

    def __call__(self):
        config = self.config
        labels = self.batches.labels
        n_labeled = labels.shape[0]
        batch = self.batches.batch()
        n_batch = batch.shape[0]
        if self.augment is not None:
            # The labeled rows come first (see ``_batches``).
            unlabeled = batch[n_labeled:]
            if self.augment_unlabeled:
                batch = self.augment(batch)
            else:
                labeled = self.augment(batch[:n_labeled])
                batch = torch.cat([labeled, unlabeled])
            if self.with_consistency:
                # A second view of the unlabeled batch, warped independently
                # of the first (drawn after it: fits without consistency keep
                # their random stream). It is embedded in the same pass.
                batch = torch.cat([batch, self.augment(unlabeled)])
        with autocast_context(self.device, config.precision):
            embeddings = self.embed(batch)
            logits = self.model.logits(embeddings[:n_labeled])
        labeled_embeddings = embeddings[:n_labeled]
        p_ab, p_ba, p_aba = association_matrices(
            labeled_embeddings, embeddings[n_labeled:n_batch]
        )
        walker = walker_loss(p_aba, labels)
        visit = visit_loss(p_ab)
        logit = classification_loss(logits, labels)
        association = config.walker_weight * walker + config.visit_weight * visit
        losses = [walker, visit, logit]
        if self.with_consistency:
            # Where the walk from the second view ends should match where the
            # walk from the first one ends (the target, held fixed).
            n_classes = logits.shape[1]
            p_view = backward_transitions(labeled_embeddings, embeddings[n_batch:])
            consistency = consistency_loss(
                walker_class_probabilities(p_ba, labels, n_classes),
                walker_class_probabilities(p_view, labels, n_classes),
            )
            association = association + config.consistency_weight * consistency
            losses.append(consistency)
        total = self.association_scale() * association + config.logit_weight * logit
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self.optimizer.step()
        if self.ema_params is not None:
            with torch.no_grad():
                torch._foreach_lerp_(
                    self.ema_params, self.params, 1.0 - self.config.ema_decay
                )

        terms = torch.stack([total, *losses]).detach()
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
    term (:func:`skassoc._losses.l2_penalty`), without the dozens of small
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


def _make_optimizer(model, config, device, capturable):
    groups = _parameter_groups(model, config)
    if capturable:
        # A tensor learning rate is read by the captured graph on every replay;
        # the scheduler updates it in place.
        # The fused kernel updates every parameter in one launch.
        return torch.optim.Adam(
            groups,
            lr=torch.tensor(config.learning_rate, device=device),
            capturable=True,
            fused=True,
        )
    return torch.optim.Adam(groups, lr=config.learning_rate)


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
        ``"validation_step"``). It must not change the model.

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
    """
    if device.type != "cuda":
        return _train(model, batches, config, device, None, evaluate)
    with borrowed_streams(device) as streams, _own_stream(device, streams[0]):
        return _train(model, batches, config, device, streams, evaluate)


@contextlib.contextmanager
def _own_stream(device, stream):
    """Run a fit on a CUDA stream of its own (borrowed for the fit).

    Fits in several threads of one process (``GridSearchCV`` under joblib's
    threading backend) then run side by side on the GPU; on the default
    stream they would wait for each other. Separate processes gain nothing
    this way: the GPU time-slices between them.
    """
    caller = torch.cuda.current_stream(device)
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        caller.wait_stream(stream)


def _rate_of_step(config, step):
    """The learning rate of (1-based) step ``step``: StepLR's schedule."""
    decays = (step - 1) // int(config.lr_decay_steps)
    return float(config.learning_rate * config.lr_decay**decays)


def _train(model, batches, config, device, streams, evaluate):
    model.train()
    use_graph = config.cuda_graph and device.type == "cuda"
    optimizer = _make_optimizer(model, config, device, capturable=use_graph)
    lr_tensors = [group["lr"] for group in optimizer.param_groups]
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=config.lr_decay_steps, gamma=config.lr_decay
    )
    step = _AssociationStep(model, batches, optimizer, config, device)
    history = {"step": [], "learning_rate": []}
    history.update({name: [] for name in step.loss_names})
    if evaluate is not None:
        history["validation_step"] = []
        history["validation_score"] = []
    result = TrainingResult(n_iter=0, history=history)
    progress = tqdm(
        total=config.max_iter, disable=not config.verbose, desc="skassoc", leave=False
    )
    logged_until = 0

    def read_losses(completed):
        nonlocal logged_until
        n_steps = completed - logged_until
        if n_steps <= 0:
            return
        sums = step.loss_sum.tolist()
        first_bad = int(step.first_nonfinite_step.item())
        if first_bad >= 0:
            raise NonFiniteLossError(
                f"The training loss became NaN or infinite at step {first_bad + 1}. "
                "The learning rate is likely too high for this data, or the "
                "inputs are on an extreme scale (for a custom network, scale "
                "them first); lower learning_rate or rescale X."
            )
        step.loss_sum.zero_()
        means = [value / n_steps for value in sums]
        history["step"].append(completed)
        # The rate of the last step run (the scheduler may have moved past it).
        history["learning_rate"].append(_rate_of_step(config, completed))
        for name, value in zip(step.loss_names, means, strict=True):
            history[name].append(value)
        logged_until = completed
        progress.update(n_steps)
        progress.set_postfix(
            {name: f"{v:.3f}" for name, v in zip(step.loss_names, means, strict=True)}
        )

    def validate(completed):
        """Score the model after step ``completed`` when a score is due."""
        if evaluate is None:
            return
        due = completed % config.validation_interval == 0
        if not (due or completed == config.max_iter):
            return
        with step.fitted_weights():
            model.eval()
            try:
                score = evaluate()
            finally:
                model.train()
        history["validation_step"].append(completed)
        history["validation_score"].append(float(score))

    graph = None
    completed = 0
    try:
        lock = cuda_rng_lock(device)
        if use_graph:
            # Eager warm-up steps on a side stream, then the capture.
            _, side, capture_stream = streams
            with lock:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    while completed < min(_GRAPH_WARMUP_STEPS, config.max_iter):
                        step.prefetch()
                        step()
                        completed += 1
                        scheduler.step()
                        _keep_lr_tensor(optimizer, lr_tensors)
                        validate(completed)
                torch.cuda.current_stream().wait_stream(side)
                graph = _capture(step, capture_stream)
        while completed < config.max_iter:
            step.prefetch()
            with lock:
                if graph is not None:
                    graph.replay()
                else:
                    step()
            completed += 1
            if completed % config.log_interval == 0 or completed == config.max_iter:
                read_losses(completed)
            scheduler.step()
            if use_graph:
                _keep_lr_tensor(optimizer, lr_tensors)
            validate(completed)
        # A run no longer than the graph's eager warm-up never enters the
        # loop: its losses still need reading (and checking for NaN).
        read_losses(completed)
    except KeyboardInterrupt:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result.interrupted = True
        # The losses of the steps that did complete are still worth keeping;
        # a loss that went non-finite before the interrupt still raises.
        read_losses(completed)
    finally:
        progress.close()
    step.use_average_weights()
    # The last step's gradients are of no use to the fitted model.
    optimizer.zero_grad(set_to_none=True)
    result.n_iter = completed
    model.eval()
    return result


def default_log_interval(max_iter):
    """Read losses back about 100 times a run, at most every 10 steps."""
    return max(10, math.ceil(max_iter / 100))
