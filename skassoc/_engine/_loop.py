"""The training loop: K >= 1 models, one step at a time, callbacks between.

The loop asks the :class:`~skassoc._engine._runner.DeviceRunner` to run each
step, reads the loss sums back at every log point (one host synchronisation
for all models) and calls each model's callbacks there. A model whose
callbacks ask it to stop is set aside with its weights and state of that
step; the loop ends when every model has stopped or ``max_iter`` is reached.
"""

import contextlib
from dataclasses import dataclass, field

import torch

from ._callback import TrainingRun, call_hook
from ._optim import Optimization, parameter_groups, sigint_deferred
from ._runner import from_another_process
from ._state import TrainingState, capture_state, restore_states
from ._step import AssociationStep

__all__ = [
    "Member",
    "TrainingResult",
    "NonFiniteLossError",
    "non_finite_message",
    "train",
]


class NonFiniteLossError(FloatingPointError):
    """Raised when a training loss becomes NaN or infinite."""


def non_finite_message(step):
    """Why a fit whose loss became NaN or infinite at ``step`` failed."""
    return (
        f"The training loss became NaN or infinite at step {step}. "
        "The learning rate is likely too high for this data, or the "
        "inputs are on an extreme scale (for a custom network, scale "
        "them first); lower learning_rate or rescale X."
    )


@dataclass
class Member:
    """One model of a run as its caller sees it.

    Attributes
    ----------
    estimator : SemiSupervisedAssociationClassifier
        The estimator the model is trained for (callbacks see it).
    callbacks : list
        Its callbacks, built-in ones first (see ``_builtin``).
    snapshot : callable, optional
        ``snapshot(run)`` returns a fitted copy of the estimator as if
        training ended now (``TrainingRun.snapshot``).
    state : TrainingState, optional
        Where a continued run starts (None: step 0).
    history : dict
        The history to continue (a continued run's earlier entries).
    """

    estimator: object
    callbacks: list
    snapshot: object = None
    state: TrainingState | None = None
    history: dict = field(default_factory=dict)


@dataclass
class TrainingResult:
    """What a run did for one model.

    Attributes
    ----------
    n_iter : int
        Steps of its run completed (a continued run's earlier ones included).
    history : dict
    interrupted : bool
        Ended early by a Ctrl-C or an error in a callback.
    best_step : int or None
        The step of the weights early stopping kept.
    failed_at : int or None
        The (1-based) step whose loss was NaN or infinite.
    training_state : TrainingState or None
        What continuing the run needs; None when the model's weights are not
        those of its last step (early stopping kept earlier ones).
    error : Exception or None
        The error a callback raised, which ended training.
    after_training_interrupted : {"class_prior", "report"} or None
        What a Ctrl-C after training cut short (set by the fit).
    """

    n_iter: int
    history: dict
    interrupted: bool = False
    best_step: int | None = None
    failed_at: int | None = None
    training_state: TrainingState | None = None
    error: Exception | None = None
    after_training_interrupted: str | None = None


class _CallbackError(Exception):
    """Carries an error raised by a callback out of the loop."""

    def __init__(self, error):
        # Not str(error): a callback's error may fail to give one.
        super().__init__(type(error).__name__)
        self.error = error


def train(models, batches, configs, runner, members):
    """Train ``models`` in place, model ``k`` with ``configs[k]``'s loss weights.

    Parameters
    ----------
    models : list of AssociationModel
        On the runner's device.
    batches : DeviceBatches, HostBatches or SparseBatches
    configs : list of TrainingConfig
        One per model; they differ only in their loss weights.
    runner : DeviceRunner
        Entered by the caller.
    members : list of Member
        One per model: its estimator, callbacks and where it starts.

    Returns
    -------
    results : list of TrainingResult

    Raises
    ------
    KeyboardInterrupt
        If interrupted before the first step of this fit completed (nothing
        was learned). An interrupt after that ends training early instead
        (``TrainingResult.interrupted``); the caller keeps the models and
        raises the interrupt again.
    Exception
        Whatever a callback's ``on_fit_begin`` raises (nothing trained yet).
    """
    config = configs[0]
    start = members[0].state.n_iter if members[0].state is not None else 0
    for model in models:
        model.train()
    optimization = Optimization(
        parameter_groups(models, config),
        config,
        runner.device,
        runner.uses_graph,
        start,
    )
    step = AssociationStep(models, batches, configs, runner, optimization)
    restore_states(step, [member.state for member in members])
    return _Loop(step, config, members, start).run()


class _Loop:
    def __init__(self, step, config, members, start):
        self.step, self.config, self.members = step, config, members
        self.start = self.completed = start
        self.logged_until = [start] * len(members)
        self.live = list(range(len(members)))
        self.frozen, self.failed = {}, {}
        self.error, self.interrupted = None, False
        self.final_states = None
        # The callbacks whose on_fit_begin ran: only they get on_fit_end.
        self.begun = set()
        self.runs = [self._run_of(k, member) for k, member in enumerate(members)]

    def _run_of(self, k, member):
        hooks = {
            "fitted_weights": lambda: self.fitted_weights(k),
            "training_state": lambda: self._state_now(k),
        }
        if member.snapshot is not None:
            hooks["snapshot"] = member.snapshot
        history = {name: list(values) for name, values in member.history.items()}
        return TrainingRun(
            member.estimator,
            self.step.models[k],
            self.config.max_iter,
            history,
            hooks,
            step=self.start,
            loss_names=self.step.loss_names,
            rank=self.step.runner.rank,
            world_size=self.step.runner.world_size,
        )

    def _state_now(self, k):
        """Model ``k``'s training state: captured now, or at the end of
        training once the models hold their fitted (averaged) weights."""
        if self.final_states is not None:
            return self.final_states.get(k)
        return capture_state(self.step, k, self.completed)

    def fitted_weights(self, k):
        """Model ``k`` holds its moving average until the context ends (once
        training has ended, the models hold their fitted weights already)."""
        average = self.step.average
        if average is None or self.final_states is not None:
            return contextlib.nullcontext()
        return average.swapped_in(*self.step.param_ranges[k])

    def run(self):
        """Train; the results once every model has its fitted weights.

        Every callback whose ``on_fit_begin`` ran gets its ``on_fit_end``,
        whatever ends training (a failure too, with ``run.failed``).
        """
        try:
            self._begin_callbacks()
            self._steps()
        except KeyboardInterrupt:
            self.step.runner.synchronize()
            if self.completed == self.start:
                self._end_callbacks(failed=True)
                raise
            self.interrupted = True
            # The losses of the steps that did complete are still worth
            # keeping.
            self._log(call_callbacks=False)
        except _CallbackError as wrapped:
            self.error, self.interrupted = wrapped.error, True
            self._log(call_callbacks=False)
        except BaseException:
            # Nothing to keep (an error in a step, or in on_fit_begin).
            self._end_callbacks(failed=True)
            raise
        return self._finish()

    def _begin_callbacks(self):
        for k in list(self.live):
            run = self.runs[k]
            error = self._agreed(run, self._begin, self.members[k].callbacks, run)
            if error is not None:
                raise error
            if run.stop_requested:
                # Asked to stop before its first step.
                self._stop(k)

    def _begin(self, callbacks, run):
        for callback in callbacks:
            self.begun.add(id(callback))
            call_hook([callback], "on_fit_begin", run)

    def _agreed(self, run, hook, *args):
        """Call ``hook(*args)`` (callbacks' hooks); what it raised, agreed
        on by every process (:meth:`_agree`): the error this process raises,
        if any."""
        error, interrupted = None, False
        try:
            hook(*args)
        except KeyboardInterrupt:
            if self.step.runner.world_size == 1:
                raise
            interrupted = True
        except Exception as exc:
            error = exc
        return self._agree(run, error, interrupted)

    def _agree(self, run, error, interrupted=False):
        """With several processes, make every one stop (or fail) when any
        one's callbacks asked to stop (or raised): the others would wait for
        it in the next step. Returns the error this process raises, if any.

        A callback's ``KeyboardInterrupt`` in one process (``interrupted``)
        is raised in every process here, as a Ctrl-C at this log point.
        """
        runner = self.step.runner
        if runner.world_size == 1:
            return error
        raised, stop, interrupt = runner.any_process(
            error is not None, run.stop_requested, interrupted
        )
        if interrupt and error is None:
            raise KeyboardInterrupt
        if raised and error is None:
            error = from_another_process(
                RuntimeError(
                    f"Training stopped after step {self.completed}: a callback "
                    "raised in another process of the group (its error is "
                    "raised there)."
                )
            )
        run.stop_requested = stop
        return error

    def _steps(self):
        runner, optimization = self.step.runner, self.step.optimization
        # A Ctrl-C inside a step would keep a model, a generator or a sampler
        # one step ahead of the steps counted: it is raised between steps
        # (one handler for the whole loop, none installed per step).
        # With several processes, each stops at the first log point at which
        # any has one: a process that stopped a step before the others would
        # leave them waiting in that step's collectives.
        alone = runner.world_size == 1
        with sigint_deferred() as received:
            while self.completed < self.config.max_iter and self.live:
                if received and alone:
                    raise KeyboardInterrupt
                runner.run(self.step)
                self.completed += 1
                if self._is_log_point():
                    self._log()
                    if not alone and runner.any_process(received)[0]:
                        raise KeyboardInterrupt
                optimization.next_rate()
            if received and alone:
                raise KeyboardInterrupt

    def _is_log_point(self):
        completed, config = self.completed, self.config
        return (
            completed % config.log_interval == 0
            or completed == config.max_iter
            or (
                config.validation_interval is not None
                and completed % config.validation_interval == 0
            )
        )

    def _log(self, call_callbacks=True):
        """Read the loss sums back and call every live model's ``on_log``."""
        pending = [k for k in self.live if self.logged_until[k] < self.completed]
        if not pending:
            return
        step = self.step
        # One read back: each model's loss sums, then its first bad step.
        read = torch.cat([step.loss_sum, step.first_nonfinite_step[:, None]], 1)
        read = read.tolist()
        sums, first_bad = [row[:-1] for row in read], [row[-1] for row in read]
        learning_rate = step.optimization.learning_rate
        for k in pending:
            if first_bad[k] >= 0:
                self.failed[k] = int(first_bad[k]) + 1
                self.live.remove(k)
                continue
            run = self.runs[k]
            n_steps = self.completed - self.logged_until[k]
            run.step, run.learning_rate = self.completed, learning_rate
            run.losses = {
                name: value / n_steps
                for name, value in zip(step.loss_names, sums[k], strict=True)
            }
            self._record(k, run)
            if call_callbacks:
                self._call_on_log(k, run)

    def _call_on_log(self, k, run):
        """Model ``k``'s callbacks' ``on_log``; then stop it if one asked."""
        callbacks = self.members[k].callbacks[1:]
        error = self._agreed(run, call_hook, callbacks, "on_log", run)
        if error is not None:
            raise _CallbackError(error) from error
        if run.stop_requested:
            self._stop(k)

    def _record(self, k, run):
        """Add the history's entry and reset model ``k``'s sums: both or neither.

        The history is the first callback. An interrupt between the two
        would have the handler in :meth:`run` record these steps again (or
        record zeros), so an error takes the entry back.
        """
        history, previous = run.history, self.logged_until[k]
        lengths = {name: len(values) for name, values in history.items()}
        try:
            self.members[k].callbacks[0].on_log(run)
            self.logged_until[k] = self.completed
            self.step.loss_sum[k].zero_()
        except BaseException:
            for name, length in lengths.items():
                del history[name][length:]
            self.logged_until[k] = previous
            raise

    def _stop(self, k):
        """Set model ``k`` aside: the others may train on (stacked runs)."""
        self.live.remove(k)
        if self.live:
            # Its weights and state of this step, put back at the end.
            model = self.step.models[k]
            with self.fitted_weights(k):
                weights = [t.detach().clone() for t in model.state_dict().values()]
            state = capture_state(self.step, k, self.completed)
            self.frozen[k] = (self.completed, weights, state)

    @torch.no_grad()
    def _finish(self):
        step = self.step
        states = {
            k: (
                self.frozen[k][2]
                if k in self.frozen
                else capture_state(step, k, self.completed)
            )
            for k in range(len(self.members))
            if k not in self.failed
        }
        self.final_states = states
        if step.average is not None:
            step.average.copy_to_params()
        for k, (_, weights, _) in self.frozen.items():
            model_tensors = step.models[k].state_dict().values()
            for tensor, saved in zip(model_tensors, weights, strict=True):
                tensor.copy_(saved)
        # The last step's gradients are of no use to the fitted models.
        step.optimization.zero_grad()
        self._end_callbacks()
        results = [self._result(k, states.get(k)) for k in range(len(self.members))]
        for model in step.models:
            model.eval()
        return results

    def _end_callbacks(self, failed=False):
        """Every begun callback's ``on_fit_end``; their errors are kept.

        The models are trained when this runs (unless ``failed``): an error,
        or a Ctrl-C, in a callback is raised by the caller once it has kept
        them.
        """
        for k, run in enumerate(self.runs):
            run.failed = failed or k in self.failed
            run.interrupted = self.interrupted
            run.step = self.frozen[k][0] if k in self.frozen else self.completed
            for callback in self.members[k].callbacks:
                if id(callback) not in self.begun:
                    continue
                try:
                    call_hook([callback], "on_fit_end", run)
                except KeyboardInterrupt:
                    self.interrupted = run.interrupted = True
                except BaseException as exc:  # noqa: BLE001 -- raised by the caller
                    if self.error is None:
                        self.error = exc

    def _result(self, k, state):
        run = self.runs[k]
        if run.best_step is not None:
            state = None  # the weights are those of an earlier step
        return TrainingResult(
            n_iter=run.step,
            history=run.history,
            interrupted=self.interrupted,
            best_step=run.best_step,
            failed_at=self.failed.get(k),
            training_state=state,
            error=self.error,
        )
