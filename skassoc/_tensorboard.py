"""A callback that writes a fit's history to TensorBoard event files."""

import os

from ._engine._callback import Callback

__all__ = ["TensorBoard"]

_INSTALL_ADVICE = (
    "The TensorBoard callback needs the tensorboard package, which skassoc "
    'does not install by default: pip install "skassoc[tensorboard]".'
)


class TensorBoard(Callback):
    """Write the losses, the learning rate and the validation scores of every
    fit to TensorBoard event files (through ``torch.utils.tensorboard``).

    At every log point the callback writes, against the training step:

    - each loss term's mean over the last log interval under
      ``"loss/<name>"`` (``"loss/total"``, ``"loss/walker"``,
      ``"loss/visit"``, ``"loss/logit"``, ...);
    - the learning rate of the last step under ``"learning_rate"``;
    - when the fit validates (``early_stopping=True`` or ``X_val`` and
      ``y_val`` given), each validation score under ``"validation/score"``
      at the step it was measured at.

    The values are those of the estimator's ``history_``, read on the host
    after the training loop has read them back from the device: writing them
    adds no synchronisation to a training step. A fit that a Ctrl-C ends
    early still gets its last losses written.

    Each fit opens a new event file and closes it when training ends. A
    continued run (``warm_start`` from a run that had not reached
    ``max_iter``) writes only the steps it adds, and asks TensorBoard to hide
    the events of ``log_dir`` past the step it continues from (torch's
    ``purge_step``): those a run that went on from that state wrote before it
    crashed, say, would otherwise be shown twice.

    Requires the ``tensorboard`` package: ``pip install
    "skassoc[tensorboard]"``. Show the curves with ``tensorboard --logdir
    runs``.

    Parameters
    ----------
    log_dir : str or path-like, default=None
        The directory the event files are written to. None: torch's default,
        ``runs/<date and time>_<host name><comment>`` under the working
        directory, a new one for every fit.
    comment : str, default=""
        Appended to the name of the default directory; ignored when
        ``log_dir`` is given.

    See Also
    --------
    torch.utils.tensorboard.SummaryWriter : The writer this callback uses.

    Notes
    -----
    The writer exists only during a fit: outside one, the callback holds no
    open file or thread, so that it can be cloned (a search deep-copies the
    estimator's callbacks for every fit) and pickled.

    In a data-parallel fit (``devices``, ``torchrun``) process 0 alone
    writes: the processes share one history.

    The fits of a search (each candidate and fold, the candidates of a
    stacked search too) all write to ``log_dir``, where TensorBoard shows
    them as one run; with ``log_dir=None``, fits that start within the same
    second share a directory as well.

    Examples
    --------
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc.callbacks import TensorBoard
    >>> clf = SemiSupervisedAssociationClassifier(
    ...     max_iter=200, device="cpu", callbacks=[TensorBoard("runs/blobs")])
    >>> clf.callbacks
    [TensorBoard('runs/blobs')]
    """

    def __init__(self, log_dir=None, *, comment=""):
        self.log_dir = log_dir
        self.comment = comment
        self._writer = None

    def __repr__(self):
        args = [] if self.log_dir is None else [repr(os.fspath(self.log_dir))]
        if self.comment:
            args.append(f"comment={self.comment!r}")
        return f"{type(self).__name__}({', '.join(args)})"

    def __getstate__(self):
        # An open writer (a fit that ended without on_fit_end: another
        # callback's on_fit_begin raised) has a thread: never copy it.
        state = self.__dict__.copy()
        state["_writer"] = None
        return state

    def on_fit_begin(self, run):
        """Open the event file; skip the history a continued run starts with.
        In process 0 of a data-parallel fit alone: the others would write
        the same curves again."""
        summary_writer = _summary_writer_class()
        self._close()
        if run.rank != 0:
            return
        log_dir = None if self.log_dir is None else os.fspath(self.log_dir)
        self._writer = summary_writer(
            log_dir=log_dir,
            comment=self.comment,
            # The continued state's own step stays: its fit wrote it.
            purge_step=run.step + 1 if run.step > 0 else None,
        )
        # Entries already in the history are a continued run's earlier
        # steps: written by the fit that made them (or never, by choice).
        self._n_logged = len(run.history.get("step", ()))
        self._n_validated = len(run.history.get("validation_step", ()))

    def on_log(self, run):
        """Write the history entries added since the last log point."""
        if self._writer is not None:
            self._write_new_entries(run)

    def on_fit_end(self, run):
        """Write what is left (the losses of an interrupted run's last steps)
        and close the event file."""
        if self._writer is None:
            return
        try:
            self._write_new_entries(run)
        finally:
            self._close()

    def _write_new_entries(self, run):
        history, writer = run.history, self._writer
        steps = history.get("step", ())
        for i in range(self._n_logged, len(steps)):
            step = steps[i]
            for name in run.loss_names:
                writer.add_scalar(f"loss/{name}", history[name][i], step)
            writer.add_scalar("learning_rate", history["learning_rate"][i], step)
        self._n_logged = len(steps)
        steps = history.get("validation_step", ())
        scores = history.get("validation_score", ())
        for i in range(self._n_validated, len(steps)):
            writer.add_scalar("validation/score", scores[i], steps[i])
        self._n_validated = len(steps)

    def _close(self):
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()  # flushes the events still queued


def _summary_writer_class():
    """``torch.utils.tensorboard.SummaryWriter``, imported on first use (the
    ``tensorboard`` package is an optional dependency)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(_INSTALL_ADVICE) from exc
    return SummaryWriter
