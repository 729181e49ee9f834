"""One fit over several devices from a plain ``fit`` call: worker processes.

With ``devices=[...]`` the estimator starts one process per device (torch's
``spawn`` start method), joins them into a process group (NCCL for GPUs,
gloo for CPUs) and has each call ``fit`` on the same data, which trains
data-parallel (see :class:`~skassoc._engine._runner.DeviceRunner`). Every
process writes its outcome (its fitted estimator and the error it raised,
if any) to a file of this fit's own temporary folder; the caller's estimator
takes process 0's fitted state, as if it had trained in one process, then
raises the error a process raised (a Ctrl-C or a callback's error keeps the
model of the steps completed, as in one process). Numeric arrays travel in
shared memory, a whole memory map by its file name, anything else pickled.
"""

import inspect
import math
import mmap
import multiprocessing
import os
import pickle
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from multiprocessing.pool import RemoteTraceback
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._fitted import get_fitted_state, is_fitted
from .._io._atomic import write_atomically
from .._utils import user_stacklevel
from ._device import resolve_device
from ._runner import is_from_another_process

__all__ = ["resolve_devices", "fit_on_devices", "warn_again"]

# Where a worker's warnings point that skassoc pointed at its caller: the
# entry of torch's spawned processes.
_WORKER_ENTRY = os.path.abspath(inspect.getfile(mp.start_processes))

# After a worker ended with an error, the others get this long to end too
# before they are stopped: gloo's notice their peer left at once, NCCL's
# wait in their collective until its timeout (minutes).
_PEER_GRACE_SECONDS = 30

# After a Ctrl-C, the workers finish their step and keep their model: they
# get this long before they are stopped.
_INTERRUPT_GRACE_SECONDS = 60

# A stopped worker gets this long to end after SIGTERM, then it is killed
# (one that ignores SIGTERM, or is stuck in a call, would hold the caller).
_STOP_SECONDS = 10


def resolve_devices(devices):
    """The ``devices`` parameter as a list of :class:`torch.device`.

    Raises
    ------
    ValueError
        If a device does not exist here, the devices mix types, or one
        appears twice.
    """
    if isinstance(devices, str) and devices == "all":
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(
                "devices='all' trains on every GPU, but CUDA sees none here. "
                "Leave devices=None, or list CPU devices (devices=['cpu', 'cpu'])."
            )
        return [torch.device("cuda", k) for k in range(count)]
    if len(devices) == 0:
        raise ValueError(
            "devices is empty: list the devices to train on (devices=[0, 1], "
            "'all'), or leave devices=None to train in this process."
        )
    resolved = [_device_of(device) for device in devices]
    types = {device.type for device in resolved}
    if len(types) != 1 or types - {"cpu", "cuda"}:
        raise ValueError(
            f"devices must be GPUs only or CPUs only; got {[str(d) for d in resolved]}."
        )
    gpus = [device for device in resolved if device.type == "cuda"]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"devices lists a GPU twice: {[str(d) for d in gpus]}.")
    return resolved


def _device_of(device):
    """One entry of ``devices``: an int is a GPU index; checked as ``device``."""
    device = torch.device("cuda", device) if isinstance(device, int) else device
    resolved = resolve_device(device)
    if resolved.type == "cuda" and resolved.index is None:
        raise ValueError("devices lists GPUs by index: 0, 1, ... or 'cuda:0'.")
    return resolved


def _shared(value):
    """``value`` for the workers: a whole memory map by its file, a numeric
    array in shared memory, anything else (a DataFrame, strings) pickled."""
    if value is None:
        return None
    if (
        isinstance(value, np.memmap)
        and isinstance(value.base, mmap.mmap)
        and value.flags.c_contiguous
        # A copy-on-write map ("c") holds changes the file lacks, and a map
        # of an unnamed or deleted file has no file to open: sent as arrays.
        and value.mode != "c"
        and isinstance(value.filename, (str, os.PathLike))
        and os.path.isfile(value.filename)
    ):
        # The memory map as opened (not a slice or a view of one, which would
        # need its own offset): each worker opens the file itself.
        filename = os.fspath(value.filename)
        return ("memmap", filename, value.dtype.str, value.shape, value.offset)
    if (
        isinstance(value, np.ndarray)
        and value.dtype.kind in "biuf"
        and value.dtype.isnative
    ):
        # One copy, into shared memory (a read-only array is never viewed).
        dtype = torch.from_numpy(np.empty(0, dtype=value.dtype)).dtype
        shared = torch.empty(value.shape, dtype=dtype).share_memory_()
        shared.numpy()[...] = value
        return ("shared", shared)
    return ("pickle", value)


def _unshared(entry):
    if entry is None:
        return None
    kind, *rest = entry
    if kind == "memmap":
        filename, dtype, shape, offset = rest
        return np.memmap(filename, dtype=dtype, mode="r", shape=shape, offset=offset)
    if kind == "pickle":
        return rest[0]
    return rest[0].numpy()


def _check_start_method():
    """Refuse to start workers from inside a loky worker (a search's
    ``n_jobs``) or a daemonic process (a ``multiprocessing.Pool``'s): such
    processes cannot spawn processes of their own."""
    if multiprocessing.current_process().daemon:
        raise RuntimeError(
            "devices=[...] starts processes of its own, which a daemonic "
            "process (a multiprocessing.Pool worker, joblib's "
            "'multiprocessing' backend) cannot do. Fit in the main process, "
            "or under joblib's Dask backend with a worker per GPU and "
            "devices=None."
        )
    if multiprocessing.get_start_method(allow_none=True) == "loky":
        raise RuntimeError(
            "devices=[...] starts processes of its own, which a loky worker "
            "(GridSearchCV or cross_validate with n_jobs) cannot do. Run the "
            "search with n_jobs=1, or under joblib's Dask backend with a "
            "worker per GPU and devices=None."
        )


class Outcome(NamedTuple):
    """What a worker process wrote for the caller."""

    #: Process 0's fitted state (None elsewhere, or when it has none).
    state: object
    #: What the process raised, or None.
    error: BaseException | None
    #: When it caught ``error`` (``time.monotonic()``, one clock for every
    #: process of the host; None without an error).
    failed_at: float | None = None
    #: Process 0's warnings, as ``(message, category, filename, lineno,
    #: module)``.
    warned: tuple = ()


def fit_on_devices(estimator, devices, X, y, fit_params):
    """Fit ``estimator`` data-parallel on ``devices``.

    Returns
    -------
    state : FittedState or None
        Process 0's fitted state (the new model, or the one it had when its
        fit failed early); None when it has none.
    error : BaseException or None
        What a process raised: the original error (a callback's, a Ctrl-C,
        a NaN loss, a failure of one process), not its peers' "another
        process raised" or their failed collectives.
    warned : tuple
        Process 0's warnings, for :func:`warn_again` once the state is set.
    """
    _check_start_method()
    backend = "nccl" if devices[0].type == "cuda" else "gloo"
    shared = ([_shared(X), _shared(y)], {k: _shared(v) for k, v in fit_params.items()})
    with tempfile.TemporaryDirectory() as folder:
        args = (
            # Bytes, unpickled in the worker: an estimator the worker cannot
            # rebuild (a callback of a notebook's __main__) fails there,
            # with its traceback in the caller's error.
            pickle.dumps(estimator),
            [str(d) for d in devices],
            backend,
            folder,
            shared,
            portable_filters(),
        )
        with _CallerSignals() as signals:
            processes = mp.start_processes(
                _worker,
                args=args,
                nprocs=len(devices),
                join=False,
                start_method="spawn",
            )
            interrupted = _join(processes, folder, signals)
        outcomes = [_outcome(folder, rank) for rank in range(len(devices))]
    error = _original_error(outcomes)
    if interrupted and not isinstance(error, KeyboardInterrupt):
        # The caller's Ctrl-C, whatever the workers made of it (they may
        # have finished, or died starting): a script or a search must stop.
        interrupt = KeyboardInterrupt()
        interrupt.__context__ = error  # what a worker raised, if anything
        error = interrupt
    return outcomes[0].state, error, outcomes[0].warned


def _original_error(outcomes):
    """The error that stopped the fit: the first one caught. A process whose
    peer failed raises too, later (its collective loses the peer, or its
    callbacks learn of the peer's error), with an error that says less."""
    failed = [o for o in outcomes if o.error is not None]
    if not failed:
        return None
    original = [o for o in failed if not is_from_another_process(o.error)]
    # A process that ended without its result has no time: it comes last.
    first = min(
        original or failed,
        key=lambda o: math.inf if o.failed_at is None else o.failed_at,
    )
    return first.error


def warn_again(warned):
    """Process 0's warnings, warned here under this process's filters: at
    their own place (and module), or at the caller of ``fit`` for those the
    worker pointed at its own entry (skassoc's warnings point past skassoc)."""
    for message, category, filename, lineno, module in warned:
        if os.path.abspath(filename) == _WORKER_ENTRY:
            warnings.warn(message, category, stacklevel=user_stacklevel())
        else:
            warnings.warn_explicit(message, category, filename, lineno, module)


def _join(processes, folder, signals):
    """Wait for the workers; on a Ctrl-C, let them keep their models first.
    A signal held while they started (see :class:`_CallerSignals`) acts at
    once.

    Returns
    -------
    interrupted : bool
        Whether this process got a Ctrl-C while it waited.
    """
    n_devices = len(processes.processes)
    try:
        # From here a signal raises inside this try; one held acts now.
        signals.running()
        _wait(processes, folder)
    except KeyboardInterrupt:
        _interrupt(processes)
        return True
    except mp.ProcessRaisedException as exc:
        _stop(processes)
        raise RuntimeError(
            f"A worker process of the fit on {n_devices} devices failed; the "
            f"estimator is left as it was. The worker's error:\n{exc}"
        ) from None
    except mp.ProcessExitedException as exc:
        _stop(processes)
        started = os.path.exists(_started_path(folder, exc.error_index))
        raise RuntimeError(
            f"A worker process of the fit on {n_devices} devices died ({exc}); "
            f"the estimator is left as it was.{_main_guard_hint(exc, started)}"
        ) from None
    except BaseException:
        _stop(processes)
        raise
    return False


class _CallerSignals:
    """The caller's Ctrl-C and SIGTERM while its workers start and run.

    While they start, both are held, whatever the handlers (one that came
    between two starts would leave the started workers waiting at the
    rendezvous: they have a process group of their own, which neither a
    terminal's Ctrl-C nor a scheduler's SIGTERM to the caller reaches).
    :meth:`running` then acts on what was held, inside the wait's ``try``,
    and from there a signal whose handler was Python's default raises:
    a Ctrl-C ``KeyboardInterrupt``, a SIGTERM (a job scheduler's time limit,
    a ``kill``) ``SystemExit(143)``, so that the workers are stopped and the
    temporary folder removed on the way out, where Python's default would
    end the caller alone; a second SIGTERM is then ignored, not to cut that
    stop short. A handler of the caller's own gets its signals back (a held
    one raised again). Outside the main thread nothing changes (no handler
    can be set there).
    """

    _DEFAULTS = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
    }

    def __init__(self):
        self.held, self.starting, self.previous = [], True, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self._DEFAULTS:
                # None: a handler set outside Python, which cannot be put back.
                if signal.getsignal(signum) is not None:
                    self.previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum, frame):
        if self.starting:
            # Only recorded: a worker started after an ignore would inherit it.
            self.held.append(signum)
        elif signum == signal.SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            raise SystemExit(128 + signum)
        else:
            raise KeyboardInterrupt

    def running(self):
        """The workers have started: hand a handler of the caller's own its
        signals back (a held one raised again), and act on a held signal
        whose handler was the default."""
        self.starting = False
        for signum, handler in self.previous.items():
            if handler is not self._DEFAULTS[signum]:
                signal.signal(signum, handler)
                if signum in self.held:
                    signal.raise_signal(signum)
        for signum in (signal.SIGTERM, signal.SIGINT):
            if signum in self.held and self.previous[signum] is self._DEFAULTS[signum]:
                self._on_signal(signum, None)


def _wait(processes, folder):
    """Until every worker has ended, or one ended with an error and the
    others had :data:`_PEER_GRACE_SECONDS` to follow (then they are
    stopped: their outcomes count as missing, the first error is raised)."""
    deadline, read = None, set()
    while not processes.join(timeout=1):
        if deadline is None and _one_failed(processes, folder, read):
            deadline = time.monotonic() + _PEER_GRACE_SECONDS
        if deadline is not None and time.monotonic() > deadline:
            _stop(processes)
            return


def _one_failed(processes, folder, read):
    """Whether a worker has ended and written an error. ``read`` holds the
    ranks whose outcome was read already, without one (each is read once:
    process 0's holds the fitted model)."""
    none = pickle.dumps(None)
    for rank, process in enumerate(processes.processes):
        path = _outcome_path(folder, rank)
        if rank in read or process.is_alive() or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            # Written by this fit's own worker; the error itself stays bytes.
            if pickle.load(handle)[1] != none:
                return True
        read.add(rank)
    return False


def _interrupt(processes):
    """Pass a Ctrl-C on to the workers, which stop at their next log point
    and write their models, and wait for them (a second Ctrl-C stops them
    at once).

    The workers have a process group of their own, so that every Ctrl-C (a
    terminal's, a notebook's interrupt, a ``kill -INT``) reaches this
    process alone and each worker gets it once, from here.
    """
    try:
        for process in processes.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGINT)
        deadline = time.monotonic() + _INTERRUPT_GRACE_SECONDS
        for process in processes.processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        _stop(processes)


def _main_guard_hint(exc, started):
    """A hint for a worker that exited with an error before it started its
    fit, while importing the caller's main module again (as the spawn start
    method does for a script): a script that fits at import makes the
    worker start workers of its own, which Python refuses with an error
    printed above the caller's."""
    if exc.signal_name is not None or exc.exit_code != 1 or started:
        return ""
    if not _main_imported_again():
        return ""
    return (
        " It ended before its fit started, most likely while importing the "
        "calling script again, as each worker does, which runs the script's "
        "top-level code in it: if the script "
        'calls fit outside an `if __name__ == "__main__":` block, put it '
        "inside one. The worker's own error is printed above."
    )


def _main_imported_again():
    """Whether spawned processes import the main module again: Python's rule
    (``multiprocessing.spawn.get_preparation_data``): by its name unless it
    is a package's ``__main__``, else by its file; a notebook or an
    interactive interpreter has neither."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return not (name == "__main__" or name.endswith(".__main__"))
    return getattr(main, "__file__", None) is not None


def _started_path(folder, rank):
    return os.path.join(folder, f"started{rank}")


def _outcome_path(folder, rank):
    return os.path.join(folder, f"outcome{rank}.pickle")


def _stop(processes):
    for process in processes.processes:
        if process.is_alive():
            process.terminate()
    for process in processes.processes:
        process.join(_STOP_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()


def _outcome(folder, rank):
    """What worker ``rank`` wrote (an :class:`Outcome`); a missing file (a
    worker stopped before it could write) counts as a failure."""
    path = _outcome_path(folder, rank)
    if not os.path.isfile(path):
        return Outcome(
            None,
            RuntimeError(
                f"Worker process {rank} of the fit on several devices ended "
                "without its result; the estimator is left as it was."
            ),
        )
    with open(path, "rb") as handle:
        # Written by this fit's own worker, in this fit's own folder.
        state, error, failed_at, warned, described = pickle.load(handle)
    try:
        error = pickle.loads(error)
    except Exception as exc:  # noqa: BLE001 -- a class this process lacks
        error = RuntimeError(
            f"Worker process {rank} raised {described[0]} (its class cannot be "
            f"rebuilt in this process: {exc})"
        )
    if described is not None:
        # As multiprocessing's pools show a worker's error: its traceback
        # there, as the cause of the error raised here.
        error.__cause__ = RemoteTraceback(f'\n"""\n{described[1]}"""')
    try:
        warned = pickle.loads(warned)
    except Exception:  # noqa: BLE001 -- a warning class this process lacks
        warned = ()
    return Outcome(pickle.loads(state), error, failed_at, warned)


def portable_filters():
    """The caller's warning filters, for a worker: each entry pickled apart
    (its regular expressions as their patterns), those that do not pickle
    left out (a category class that no module holds)."""
    portable = []
    for action, message, category, module, lineno in warnings.filters:
        entry = (action, _pattern(message), category, _pattern(module), lineno)
        try:
            portable.append(pickle.dumps(entry))
        except Exception:  # noqa: BLE001, S112 -- not a filter a worker can use
            continue
    return portable


def _pattern(field):
    """A filter's message or module as ``filterwarnings`` takes it: a
    compiled expression's pattern; a plain string (Python's own default
    filters hold one) matches exactly; None matches all ("")."""
    if field is None:
        return ""
    if isinstance(field, str):
        return re.escape(field) + r"\Z"
    return field.pattern


def use_filters(portable):
    """Make :func:`portable_filters`' entries this process's filters, in
    their order; an entry whose category this process cannot import is left
    out."""
    warnings.resetwarnings()
    for entry in portable:
        try:
            action, message, category, module, lineno = pickle.loads(entry)
        except Exception:  # noqa: BLE001, S112 -- a class the caller alone has
            continue
        warnings.filterwarnings(action, message, category, module, lineno, append=True)


def _worker(rank, estimator, devices, backend, folder, shared, filters):
    """One process of the group: fit, then write the outcome."""
    # The caller reads this to tell a failed start (the main module imported
    # again) from a death during the fit.
    open(_started_path(folder, rank), "w").close()
    # Out of the terminal's process group: a Ctrl-C reaches the caller only,
    # which passes it on once (two, a step apart, would end the fit's
    # shutdown instead of its training).
    os.setpgid(0, 0)
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # The parent's thread rule, once per process (see _device.FIT_THREADS).
        torch.set_num_threads(1)
    worker = pickle.loads(estimator).set_params(devices=None, device=str(device))
    (X, y), params = [_unshared(e) for e in shared[0]], shared[1]
    params = {name: _unshared(value) for name, value in params.items()}
    dist.init_process_group(
        backend,
        init_method="file://" + os.path.join(folder, "rendezvous"),
        rank=rank,
        world_size=len(devices),
    )
    error = failed_at = None
    # Under the caller's filters, as in the caller: "error" fails the fit,
    # "ignore" drops a warning. The others are recorded, not printed:
    # process 0's are warned again in the caller (filtered there again).
    with warnings.catch_warnings(record=True) as caught:
        use_filters(filters)
        try:
            worker.fit(X, y, **params)
        except BaseException as exc:  # noqa: BLE001 -- written for the caller
            error, failed_at = exc, time.monotonic()
        # The outcome is written whatever comes now: a late Ctrl-C waits.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The group is not destroyed: the process ends below, and after a
    # failure NCCL's shutdown would wait for peers that sit in a collective
    # this process never joined (the caller stops them after a grace).
    outcome = Outcome(None, error, failed_at)
    if rank == 0:
        # The caller takes process 0's state and warnings; the state alone
        # travels, so that the estimator's callbacks need not pickle.
        module_of = _modules_by_file()
        outcome = outcome._replace(
            state=get_fitted_state(worker) if is_fitted(worker) else None,
            warned=[
                (
                    str(w.message),
                    w.category,
                    w.filename,
                    w.lineno,
                    module_of.get(os.path.abspath(w.filename)),
                )
                for w in caught
            ],
        )
    _write_outcome(folder, rank, outcome)
    # gloo's threads can abort the interpreter's teardown ("terminate called
    # without an active exception"), which the caller would take for a
    # failure: the outcome is written, so the process ends here.
    os._exit(0)


def _modules_by_file():
    """The name of each loaded module by its file's absolute path (warning
    filters match modules by name); the first loaded of a file's names."""
    by_file = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path:
            by_file.setdefault(os.path.abspath(path), name)
    return by_file


def _write_outcome(folder, rank, outcome):
    """``outcome``'s state, error and warnings, each pickled apart: the
    caller may lack an error's or a warning's class (a callback's, from a
    notebook), or fail to rebuild it; the error also travels as text, with
    this process's traceback."""
    described = None
    if outcome.error is not None:
        # traceback's own text: it names the class by module, and survives
        # an error whose str() fails.
        described = (
            "".join(traceback.format_exception_only(outcome.error)).strip(),
            "".join(traceback.format_exception(outcome.error)),
        )
    try:
        error = pickle.dumps(outcome.error)
    except Exception as exc:  # noqa: BLE001 -- sent as text instead
        error = pickle.dumps(
            RuntimeError(
                f"Worker process {rank} raised {described[0]} (it cannot be "
                f"pickled to reach the caller: {exc})"
            )
        )
    try:
        warned = pickle.dumps(outcome.warned)
    except Exception:  # noqa: BLE001 -- as text, the message kept
        warned = pickle.dumps(
            [(m, UserWarning, *place) for m, _, *place in outcome.warned]
        )
    state = pickle.dumps(outcome.state)
    payload = pickle.dumps((state, error, outcome.failed_at, warned, described))
    write_atomically(
        _outcome_path(folder, rank),
        lambda handle: handle.write(payload),
        "worker outcomes",
    )
