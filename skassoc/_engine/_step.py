"""One association step for K >= 1 models, on device tensors.

A fit trains one model (K = 1); :class:`~skassoc.model_selection.StackedGridSearchCV`
trains K candidates that differ only in their loss weights. They share
everything else: the network, the initial weights (one ``random_state``),
and every batch and augmentation the step draws. The batch is drawn once,
each model embeds it with its own weights and weighs its own losses, and
one Adam updates every model (Adam and its coupled weight decay act element
by element, so one optimizer over all models is K independent ones). Each
model therefore follows the path of its separate fit with the same
``random_state``, up to the order of float operations.

The step (sampling, forward, the losses, backward, the Adam update) touches
only device tensors and never reads a value back to the host, so on a GPU
the :class:`~skassoc._engine._runner.DeviceRunner` captures it once as a CUDA
graph and replays it: at the paper's batch sizes an eager step is bound by
kernel launches, not by the GPU. With K > 1 each model computes on a CUDA
stream of its own, so the captured graph holds K independent branches that
the GPU runs side by side with the dense kernels of a single fit.

This is the only module that runs a backward pass.
"""

import warnings

import torch
from torch.utils.checkpoint import checkpoint

from .._utils import user_stacklevel
from ._augmentation import augmentation_module
from ._ema import WeightAverage
from ._loss_terms import ClassFrequencies, StepLoss, active_terms, needs_of

__all__ = [
    "AssociationStep",
    "association_scale",
    "embedding_chunk_size",
    "has_batch_norm",
]


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
    chunking (see :meth:`AssociationStep.embed`).
    """
    return None if has_batch_norm(model) else config.embedding_chunk_size


def has_batch_norm(model):
    """Whether ``model`` normalises with batch statistics (they change with
    the rows a pass sees, so a batch is never embedded in chunks)."""
    return any(
        isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
        for module in model.modules()
    )


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


class AssociationStep:
    """One training step of K models on device tensors; capturable as a graph.

    Parameters
    ----------
    models : list of AssociationModel
        The models, on the training device; model ``k`` weighs its losses
        with ``configs[k].loss_weights``.
    batches : DeviceBatches, HostBatches or SparseBatches
        Draws and gathers the batch (``_batches``); call :meth:`prefetch`
        before every step, outside a captured graph.
    configs : list of TrainingConfig
        One per model; they differ only in their loss weights.
    runner : DeviceRunner
        The device, its precision and the models' streams.
    optimization : Optimization
        Adam over every model's parameters.
    """

    def __init__(self, models, batches, configs, runner, optimization):
        config = configs[0]
        self.models, self.batches, self.config = models, batches, config
        self.runner, self.optimization = runner, optimization
        device = runner.device
        layout = step_batch_layout(config, device, models[0].embedder)
        self.memory_format, self.augment, self.augment_unlabeled = layout
        # The terms that any model turns on; a model weighs the others at 0.
        terms = active_terms(*(c.loss_weights for c in configs))
        # One StepLoss a model: a term's running estimate (the balance
        # loss's class mass) is each model's own.
        self.losses = [
            StepLoss(terms, class_frequencies(config, batches, terms)) for _ in models
        ]
        self.loss_names = self.losses[0].names
        # Python floats: a captured graph holds them as constants.
        self.weights = [
            loss.weights(c.loss_weights)
            for loss, c in zip(self.losses, configs, strict=True)
        ]
        self.second_view = "second_view" in self.losses[0].needs
        if self.second_view and config.augmentation is None:
            # The estimator refuses this earlier, with advice; this guards
            # direct use of the engine.
            raise ValueError(
                "A loss term that needs a second view of the unlabeled batch "
                "(consistency_weight > 0) needs an augmentation."
            )
        self.chunk_size = embedding_chunk_size(models[0], config)
        self.embedders = self._embedders(config.compile)
        self.streams = runner.model_streams(len(models))
        # Each model's parameters, in model order: Adam's and the moving
        # average's lists, and where each model's part of them lies.
        self.params = [p for model in models for p in model.parameters()]
        ends = torch.tensor([len(list(m.parameters())) for m in models]).cumsum(0)
        self.param_ranges = list(zip([0, *ends[:-1].tolist()], ends.tolist()))
        # A moving average of the weights, updated inside the step (so
        # inside the CUDA graph); the models take it at the end.
        self.average = (
            WeightAverage(self.params, config.ema_decay)
            if config.ema_decay is not None
            else None
        )
        # Device-side counters, so neither the weight ramp nor the loss
        # bookkeeping needs the host.
        k = len(models)
        self.step_count = torch.zeros((), device=device)
        self.loss_sum = torch.zeros(k, len(self.loss_names), device=device)
        self.first_nonfinite_step = torch.full((k,), -1.0, device=device)

    def _embedders(self, compile_options):
        """Each model's embedder, compiled when asked.

        Compiled here, before any step: bad options fail the fit before
        training. Compilation happens at the first call (the first warm-up
        step); a network of the same structure in a later fit reuses it.
        """
        embedders = [model.embedder for model in self.models]
        if compile_options is None:
            return embedders
        n_unlabeled = self.batches.sampler.unlabeled_batch_size
        rows = self.batches.labels.shape[0] + (1 + self.second_view) * n_unlabeled
        if self.chunk_size is not None and rows > self.chunk_size:
            warnings.warn(
                f"compile has no effect on this fit: its batch of {rows} "
                f"samples is embedded in chunks of {self.chunk_size}, which "
                "run uncompiled. Leave compile off, or use a smaller "
                "unlabeled_batch_size.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return [torch.compile(embedder, **compile_options) for embedder in embedders]

    def prefetch(self):
        """Host work that must precede the next step (see ``_batches``)."""
        self.batches.prefetch()

    def zero_grad(self):
        self.optimization.zero_grad()

    def embed(self, k, x):
        """Model ``k``'s embeddings of the formatted batch ``x``; with several
        processes, each embeds its share and they gather the rest."""
        runner = self.runner
        if runner.world_size == 1:
            return self._embed_rows(k, x)
        rows, sizes = runner.rows_of_this_process(x)
        return runner.gather_rows(self._embed_rows(k, rows), sizes)

    def _embed_rows(self, k, x):
        """Model ``k``'s embeddings of the rows ``x``.

        Above ``config.embedding_chunk_size`` samples, each chunk's
        activations are dropped after its forward pass and recomputed in the
        backward pass (activation checkpointing): an unlabeled batch of tens
        of thousands of images then needs the activation memory of one
        chunk, for about a third more compute. Networks with batch norm are
        never chunked: their statistics would change with the chunking.
        """
        chunk = self.chunk_size
        if chunk is None or x.shape[0] <= chunk:
            return self.embedders[k](x)
        embedder = self.models[k].embedder
        # The network draws no random numbers (augmentation happened before),
        # so no RNG state needs saving; that also keeps the step capturable.
        return torch.cat(
            [
                checkpoint(
                    embedder, part, use_reentrant=False, preserve_rng_state=False
                )
                for part in x.split(chunk)
            ]
        )

    def _model_terms(self, k, x, n_batch, scale, labeled_weights):
        """Model ``k``'s loss terms, its backward pass run; ``(n_terms,)``."""
        model, labels = self.models[k], self.batches.labels
        with self.runner.autocast():
            embeddings = self.embed(k, x)
            logits = model.logits(embeddings[: labels.shape[0]])
        terms = self.losses[k](
            embeddings,
            logits,
            labels,
            n_batch,
            self.weights[k],
            scale,
            labeled_weights=labeled_weights,
        )
        terms[0].backward()
        return terms.detach()

    def _all_terms(self, x, n_batch):
        """Every model's loss terms, ``(K, n_terms)``; on a GPU with K > 1,
        each model on its own stream."""
        args = (x, n_batch, self.association_scale(), self.batches.labeled_weights())
        if self.streams is None:
            return torch.stack(
                [self._model_terms(k, *args) for k in range(len(self.models))]
            )
        caller = torch.cuda.current_stream(self.runner.device)
        terms = []
        for k, stream in enumerate(self.streams):
            stream.wait_stream(caller)
            # x is freed on the caller's stream: its memory must not be
            # reused before this stream's kernels have read it.
            x.record_stream(stream)
            with torch.cuda.stream(stream):
                terms.append(self._model_terms(k, *args))
        for stream in self.streams:
            caller.wait_stream(stream)
        return torch.stack(terms)

    def association_scale(self):
        """Multiplier of the association loss terms (their delay and ramp)."""
        return association_scale(self.step_count, self.config)

    def formatted_batch(self):
        """The step's batch, augmented, in the networks' input format and
        memory layout, and its rows before the consistency loss's second view."""
        batch = self.batches.batch()
        n_batch = batch.shape[0]
        batch = augment_batch(
            batch,
            self.batches.labels.shape[0],
            self.augment,
            self.augment_unlabeled,
            self.second_view,
        )
        # Parameter-free, the same for every model (see AssociationModel).
        with self.runner.autocast():
            x = self.models[0].input_format(batch)
        return x.contiguous(memory_format=self.memory_format), n_batch

    def __call__(self):
        x, n_batch = self.formatted_batch()
        self.zero_grad()
        terms = self._all_terms(x, n_batch)
        self.runner.average_gradients(self.params)
        self.optimization.step()
        if self.average is not None:
            self.average.update()
        bad = (self.first_nonfinite_step < 0) & ~torch.isfinite(terms).all(dim=1)
        self.first_nonfinite_step.copy_(
            torch.where(bad, self.step_count, self.first_nonfinite_step)
        )
        self.loss_sum.add_(terms)
        self.step_count.add_(1)
