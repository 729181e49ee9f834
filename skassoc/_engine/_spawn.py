"""One fit over several devices from a plain ``fit`` call: worker processes.

With ``devices=[...]`` the estimator starts one process per device (torch's
``spawn`` start method), joins them into a process group (NCCL for GPUs,
gloo for CPUs) and has each call ``fit`` on the same data, which trains
data-parallel (see :class:`~skassoc._engine._runner.DeviceRunner`). Process
0 sends its fitted estimator back; the caller's estimator takes its fitted
state, as if it had trained in one process. The training arrays travel in
shared memory (each process maps them; a memory map is opened again by
name), so the data is not copied once per process.
"""

import os
import pickle
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["resolve_devices", "fit_on_devices"]


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
    resolved = []
    for device in devices:
        device = torch.device("cuda", device) if isinstance(device, int) else device
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(
                f"devices holds {device!r}, no device torch knows."
            ) from exc
        if device.type == "cuda" and device.index is None:
            raise ValueError("devices lists GPUs by index: 0, 1, ... or 'cuda:0'.")
        if device.type == "cuda" and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"devices holds {device}, but this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)."
            )
        resolved.append(device)
    types = {device.type for device in resolved}
    if len(types) != 1 or types - {"cpu", "cuda"}:
        raise ValueError(
            f"devices must be GPUs only or CPUs only; got {[str(d) for d in resolved]}."
        )
    gpus = [device for device in resolved if device.type == "cuda"]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"devices lists a GPU twice: {[str(d) for d in gpus]}.")
    return resolved


def _shared(array):
    """``array`` for the workers: a memory map by its file, else in shared memory."""
    if array is None:
        return None
    if isinstance(array, np.memmap) and array.filename is not None:
        return ("memmap", array.filename, array.dtype.str, array.shape, array.offset)
    array = np.asarray(array)
    if array.dtype == object or not array.dtype.isnative:
        return ("pickle", array)
    return ("shared", torch.from_numpy(np.ascontiguousarray(array)).share_memory_())


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


def fit_on_devices(estimator, devices, X, y, fit_params):
    """Fit ``estimator`` data-parallel on ``devices``; process 0's fitted copy.

    Raises
    ------
    RuntimeError
        If a worker process fails: its error and traceback are in the
        message, and the other workers are stopped.
    """
    backend = "nccl" if devices[0].type == "cuda" else "gloo"
    data = [_shared(X), _shared(y)]
    fit_params = {name: _shared(value) for name, value in fit_params.items()}
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = os.path.join(folder, "rendezvous")
        # A file, not a queue: a queue's pipe fills up with a large model,
        # and the process writing it would never exit.
        result = os.path.join(folder, "fitted.pickle")
        processes = mp.start_processes(
            _worker,
            args=(
                estimator,
                [str(d) for d in devices],
                backend,
                rendezvous,
                data,
                fit_params,
                result,
            ),
            nprocs=len(devices),
            join=False,
            start_method="spawn",
        )
        try:
            while not processes.join():
                pass
        except mp.ProcessRaisedException as exc:
            raise RuntimeError(
                f"A worker process of the fit on {len(devices)} devices failed; "
                f"the estimator is left as it was. The worker's error:\n{exc}"
            ) from None
        except mp.ProcessExitedException as exc:
            raise RuntimeError(
                f"A worker process of the fit on {len(devices)} devices died "
                f"({exc}); the estimator is left as it was."
            ) from None
        except BaseException:
            for process in processes.processes:
                if process.is_alive():
                    process.terminate()
            raise
        with open(result, "rb") as handle:
            # Written by this fit's own worker a moment ago.
            return pickle.load(handle)


def _worker(rank, estimator, devices, backend, rendezvous, data, fit_params, result):
    """One process of the group: fit, and from process 0 send the result."""
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # The parent's thread rule, once per process (see _device.FIT_THREADS).
        torch.set_num_threads(1)
    dist.init_process_group(
        backend,
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=len(devices),
    )
    try:
        worker = estimator.set_params(devices=None, device=str(device))
        X, y = (_unshared(entry) for entry in data)
        params = {name: _unshared(value) for name, value in fit_params.items()}
        worker.fit(X, y, **params)
        if rank == 0:
            with open(result, "wb") as handle:
                pickle.dump(worker, handle)
    finally:
        dist.destroy_process_group()
    # gloo's threads can abort the interpreter's teardown ("terminate called
    # without an active exception"), which the caller would take for a
    # failure: the work is done and written, so the process ends here.
    os._exit(0)
