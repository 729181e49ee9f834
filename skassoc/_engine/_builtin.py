"""The callbacks every fit has: history, validation and early stopping,
and the progress bar. They use the seam that users' callbacks use."""

import math

from tqdm.auto import tqdm

from ._best_weights import BestWeights
from ._callback import Callback
from ._optim import sigint_held_back

__all__ = ["History", "Validation", "ProgressBar"]


class History(Callback):
    """Appends the losses of every log point to ``run.history``."""

    def __init__(self, validates):
        self.validates = validates

    def on_fit_begin(self, run):
        for name in ("step", "learning_rate", *run.loss_names):
            run.history.setdefault(name, [])
        if self.validates:
            run.history.setdefault("validation_step", [])
            run.history.setdefault("validation_score", [])

    def on_log(self, run):
        if run.losses:
            entry = {"step": run.step, "learning_rate": run.learning_rate}
            entry.update(run.losses)
            append_entry(run.history, entry)


def append_entry(history, entry):
    """Append ``entry`` (a value per history list) whole, or not at all.

    A KeyboardInterrupt between two appends would leave the lists of
    unequal lengths; an error anywhere in here takes back what was appended.
    """
    lengths = {name: len(history[name]) for name in entry}
    try:
        for name, value in entry.items():
            history[name].append(value)
    except BaseException:
        for name, length in lengths.items():
            del history[name][length:]
        raise


class Validation(Callback):
    """Scores the model every ``interval`` steps and after the last one; with
    early stopping, keeps the best-scoring weights and stops the run.

    Parameters
    ----------
    evaluate : callable
        Called without arguments with the model in eval mode and holding
        the weights it would be fitted with; returns a score. It must not
        change the model.
    interval : int
    early_stopping : bool
        Stop after ``n_iter_no_change`` scores without a gain of ``tol``
        and end with the best-scoring weights (mirrors MLPClassifier).
    n_iter_no_change : int
    tol : float
    """

    def __init__(self, evaluate, interval, early_stopping, n_iter_no_change, tol):
        self.evaluate = evaluate
        self.interval = interval
        self.early_stopping = early_stopping
        self.n_iter_no_change, self.tol = n_iter_no_change, tol
        self.best = None

    def on_fit_begin(self, run):
        if self.early_stopping:
            self.best = BestWeights(run.model, self.n_iter_no_change, self.tol)

    def on_log(self, run):
        if run.step % self.interval and run.step != run.max_iter:
            return
        model = run.model
        with run.fitted_weights():
            model.eval()
            try:
                score = float(self.evaluate())
                # A Ctrl-C here would leave a half-made copy of the weights
                # to be restored, or best weights whose score is not in the
                # history: it is delivered once both are done.
                with sigint_held_back():
                    if self.best is not None and self.best.update(score, run.step):
                        run.stop()
                    entry = {"validation_step": run.step, "validation_score": score}
                    append_entry(run.history, entry)
            finally:
                model.train()

    def on_fit_end(self, run):
        if self.best is not None and self.best.best_step is not None:
            # The best-scoring weights (the averaged ones with ema_decay).
            self.best.restore()
            run.best_step = self.best.best_step


class ProgressBar(Callback):
    """A tqdm bar of the steps with the last losses; it stays on screen when
    training ends, as the record of what the fit did."""

    def __init__(self, verbose):
        self.verbose = verbose
        self.bar = None

    def on_fit_begin(self, run):
        self.bar = tqdm(total=run.max_iter, initial=run.step, desc="skassoc")
        self._shown = run.step

    def on_log(self, run):
        self.bar.update(run.step - self._shown)
        self._shown = run.step
        shown = dict(run.losses)
        if self.verbose >= 2 and run.losses:
            shown["lr"] = run.learning_rate
            scores = run.history.get("validation_score")
            if scores:
                shown["val"] = scores[-1]
        shown = {k: v for k, v in shown.items() if not math.isnan(v)}
        self.bar.set_postfix(
            {name: f"{value:.3g}" for name, value in shown.items()}, refresh=False
        )

    def on_fit_end(self, run):
        if self.bar is not None:
            self.bar.close()
