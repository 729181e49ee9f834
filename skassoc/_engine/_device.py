"""Where a fit runs and how: devices, precision, threads and CUDA streams.

Everything here is process-wide state that fits and predictions share: the
torch generators, the TF32 and cuDNN flags, the CPU thread count and the
CUDA stream pool. Each is changed for the duration of one fit (or one
prediction) and restored afterwards, so that the caller's settings survive
and fits in threads of one process (``GridSearchCV`` under joblib's threading
backend) do not trip over each other.
"""

import contextlib
import queue
import threading

import torch

__all__ = [
    "resolve_device",
    "cuda_rng_lock",
    "seeded_rng",
    "borrowed_streams",
    "own_stream",
    "cpu_has_native_bf16",
    "cuda_has_native_bf16",
    "autocast_context",
    "precision_context",
    "torch_threads",
    "FIT_THREADS",
]

#: Torch threads of a CPU fit. One: a fit's result then never depends on the
#: caller's thread settings or on joblib's ``n_jobs`` (torch's reductions
#: split work by thread count, so two threads give other rounding than one),
#: and fits side by side never oversubscribe the cores (the FAQ explains the
#: choice to users).
FIT_THREADS = 1

_DEVICE_TYPES = ("cpu", "cuda", "mps")


def _mps_available():
    backend = getattr(torch.backends, "mps", None)
    return backend is not None and backend.is_available()


def resolve_device(device):
    """Turn the ``device`` parameter into a :class:`torch.device` that exists here.

    ``"auto"`` is a CUDA GPU when there is one, else the CPU (Apple's MPS is
    used only when asked for by name: its support of the fit is newer and it
    computes the walker in float32).
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device={device!r} is not a device torch knows; use 'auto', 'cpu', "
            "'cuda', 'cuda:N' or 'mps'."
        ) from exc
    if resolved.type not in _DEVICE_TYPES:
        raise ValueError(
            f"device={device!r} is not supported; use 'cpu', 'cuda' or 'mps'."
        )
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r} but CUDA is not available on this machine "
                "(no GPU, or torch was built without CUDA). Use device='cpu' or "
                "device='auto'."
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r} but this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)."
            )
    if resolved.type == "mps" and not _mps_available():
        raise ValueError(
            f"device={device!r} but Apple's MPS backend is not available here "
            "(it needs macOS on Apple silicon and a torch built with MPS). Use "
            "device='cpu' or device='auto'."
        )
    return resolved


# Every fit draws its batches from torch's global CUDA generator, and CUDA
# graphs put that generator in a capture state: while one thread captures a
# step, any other use of the generator (an eager step, a replay, a reseed) in
# another thread fails, and so does a device-wide synchronisation (cuDNN
# autotuning a new shape does one). Fits and predictions in threads
# therefore take this lock for capture, for each launch and for inference; a
# replay only enqueues work, so holding the lock for it costs microseconds
# and the GPU still runs the fits' steps side by side.
_CUDA_RNG_LOCK = threading.RLock()


def cuda_rng_lock(device):
    """The process's CUDA lock on a GPU; nothing elsewhere."""
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


def _stream_pool(index):
    """The queue of stream sets of GPU ``index``, made on first use."""
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
        return free


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
    free = _stream_pool(index)
    streams = None
    try:
        streams = held[index] = free.get()
        yield streams
    finally:
        held.pop(index, None)
        if streams is not None:
            free.put(streams)


@contextlib.contextmanager
def own_stream(device, stream):
    """Run a fit on a CUDA stream of its own (borrowed for the fit).

    Fits in several threads of one process then run side by side on the
    GPU; on the default stream they would wait for each other. Separate
    processes gain nothing this way: the GPU time-slices between them.
    """
    caller = torch.cuda.current_stream(device)
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        caller.wait_stream(stream)


def cpu_has_native_bf16():
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX)."""
    # torch exposes these checks only privately; without them, assume not.
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def cuda_has_native_bf16(device):
    """Whether ``device``, a GPU, computes in bf16 natively (Ampere or later)."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


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


# torch's intra-op thread count is process-wide too: the first fit to enter
# saves the caller's count, the last to leave restores it.
_THREADS_LOCK = threading.Lock()
_thread_users = 0
_caller_threads = None


@contextlib.contextmanager
def torch_threads(device, n_threads=FIT_THREADS):
    """Run CPU work on ``n_threads`` torch threads, then restore the caller's.

    Nothing changes for GPU fits: their CPU work is the host's bookkeeping.
    """
    global _thread_users, _caller_threads
    if device.type != "cpu":
        yield
        return
    with _THREADS_LOCK:
        if _thread_users == 0:
            _caller_threads = torch.get_num_threads()
        _thread_users += 1
        if torch.get_num_threads() != n_threads:
            torch.set_num_threads(n_threads)
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _thread_users -= 1
            if _thread_users == 0 and torch.get_num_threads() != _caller_threads:
                torch.set_num_threads(_caller_threads)
