"""The callback seam: what a callback is, and what it sees of a run.

A callback is any object with some of the methods ``on_fit_begin``,
``on_log`` and ``on_fit_end``; each takes a :class:`TrainingRun`. The
training loop calls them on the host, between steps: never inside a
captured CUDA graph, so that no host synchronisation enters the step.
``on_log`` comes at every *log point*: every ``log_interval`` steps, every
``validation_interval`` steps when the fit validates, and after the last
step; the loss sums are read back from the device there, once for all
callbacks.
"""

import contextlib

__all__ = ["Callback", "TrainingRun", "HOOKS", "check_callbacks", "call_hook"]

#: The methods a callback may have, in the order the loop calls them.
HOOKS = ("on_fit_begin", "on_log", "on_fit_end")


class Callback:
    """Base class of skassoc's callbacks; subclass it and override hooks.

    Each hook receives the :class:`TrainingRun` of the model being trained
    and returns nothing. A hook that raises ends training: the model of the
    steps completed is kept (as after a Ctrl-C), and the error propagates
    from ``fit``.
    """

    def on_fit_begin(self, run):
        """Called once before the first step of a fit."""

    def on_log(self, run):
        """Called at every log point (see :mod:`skassoc.callbacks`)."""

    def on_fit_end(self, run):
        """Called once after the last step, with the model as it will be
        fitted (the moving average of the weights in place, if kept)."""


class TrainingRun:
    """What a callback sees of one model's training run.

    Attributes
    ----------
    estimator : SemiSupervisedAssociationClassifier
        The estimator being fitted. Its fitted attributes are those of the
        previous fit (or none) until the fit ends.
    model : torch.nn.Module
        The network being trained. Read it; do not change its weights.
    step : int
        Steps completed, a continued run's earlier steps included.
    max_iter : int
        The step the run ends at.
    history : dict of lists
        The history so far (``history_`` once fitted).
    loss_names : tuple of str
        The loss terms recorded (``"total"`` first).
    losses : dict of str to float
        The loss means of the last log interval (empty before the first).
    learning_rate : float
        The rate of the last step.
    interrupted : bool
        Whether a Ctrl-C or a callback that raised ended the run early. Set
        before ``on_fit_end``.
    stop_requested : bool
        Whether a callback asked the run to stop (:meth:`stop`).
    failed : bool
        Whether the model's loss became NaN or infinite (its weights are of
        no use). Set before ``on_fit_end``.
    best_step : int or None
        The step of the weights early stopping put back (``on_fit_end``).
    rank, world_size : int
        This process and the number of processes of a data-parallel fit
        (``devices``, ``torchrun``); 0 and 1 otherwise. Every process holds
        the same model and runs its callbacks: a callback that writes files
        writes in process 0 alone, as :class:`Checkpoint` and
        :class:`TensorBoard` do.
    """

    def __init__(
        self,
        estimator,
        model,
        max_iter,
        history,
        hooks,
        step=0,
        loss_names=(),
        rank=0,
        world_size=1,
    ):
        self.estimator = estimator
        self.model = model
        self.max_iter = max_iter
        self.history = history
        self.step = step
        self.loss_names = tuple(loss_names)
        self.losses = {}
        self.learning_rate = float("nan")
        self.interrupted = False
        self.stop_requested = False
        self.failed = False
        self.best_step = None
        self.rank, self.world_size = rank, world_size
        self._hooks = hooks

    def stop(self):
        """End this model's training after the current step."""
        self.stop_requested = True

    def fitted_weights(self):
        """A context in which ``model`` holds the weights it would be
        fitted with if training ended now (the moving average, if kept)."""
        return self._hooks.get("fitted_weights", contextlib.nullcontext)()

    def training_state(self):
        """The run's training state now (``training_state_``; reads the
        device back): what continuing the run from here needs."""
        return self._hooks["training_state"]()

    def snapshot(self):
        """A fitted copy of the estimator as if training ended now, with its
        training state: ``snapshot().save(path, training_state=True)``
        writes a checkpoint."""
        return self._hooks["snapshot"](self)


def check_callbacks(callbacks):
    """``callbacks`` as a list, each an object with at least one hook.

    Raises
    ------
    TypeError
        For a class (rather than an instance) or an object without hooks.
    """
    callbacks = list(callbacks or ())
    for callback in callbacks:
        if isinstance(callback, type):
            raise TypeError(
                f"callbacks holds the class {callback.__name__}; pass an "
                f"instance, e.g. {callback.__name__}(...)."
            )
        if not any(callable(getattr(callback, hook, None)) for hook in HOOKS):
            raise TypeError(
                f"callbacks holds {callback!r}, which has none of the hooks "
                f"{', '.join(HOOKS)}; subclass skassoc.callbacks.Callback."
            )
    return callbacks


def call_hook(callbacks, hook, run):
    """Call ``hook`` of every callback that has it, in order."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(run)
