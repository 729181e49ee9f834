"""The settings of one training run, resolved from an estimator's parameters."""

import math
from dataclasses import dataclass

from ._loss_terms import active_terms, needs_of

__all__ = ["TrainingConfig", "default_log_interval"]


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
    # Adam's fused kernel off the CUDA graph too (the sparse network's wide
    # first layer: one pass over its weights instead of several).
    fused_adam: bool = False
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


def default_log_interval(max_iter):
    """Read losses back about 100 times a run, at most every 10 steps."""
    return max(10, math.ceil(max_iter / 100))
