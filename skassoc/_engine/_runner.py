"""The device seam: where and how the training steps run.

:class:`DeviceRunner` owns everything about the device that a fit's steps
touch: the device itself, the precision (TF32 flags, bf16 autocast), the
CUDA streams the fit borrows, and the CUDA graph the step is captured into.
The training loop asks it to run a step and to wait for the device; nothing
else in the engine reads the device type. Training on several devices plugs
in here.
"""

import contextlib

import torch
import torch.distributed as dist

from ._device import (
    autocast_context,
    borrowed_streams,
    cuda_rng_lock,
    own_stream,
    precision_context,
)
from ._optim import sigint_deferred, sigint_held_back
from ._sync_batch_norm import WholeBatchNorms

__all__ = ["DeviceRunner"]

# Eager steps run before capture: they let cuDNN pick its kernels and the
# optimizer create its state, and they are real training steps.
GRAPH_WARMUP_STEPS = 3


class DeviceRunner:
    """Runs one fit's training steps on a device: eagerly, or as a CUDA graph.

    Use it as a context manager around training: on a GPU it borrows the
    fit's CUDA streams and makes the first one current, and it sets the
    precision flags for the fit (restored on exit).

    Parameters
    ----------
    device : torch.device
    precision : {"fp32", "tf32", "bf16"}
    cuda_graph : bool
        Capture the step as a CUDA graph after a few eager steps (on a GPU
        only; ignored elsewhere).
    group : torch.distributed.ProcessGroup, optional
        Train data-parallel with the other processes of ``group``, each on
        its own device: every process draws the step's whole batch (the
        same, from the same seed), embeds its share of the rows, gathers
        everyone's embeddings (with their gradients) and computes the
        losses of the whole batch; the gradients are then averaged. Each
        process thus takes the step one process would take on the whole
        batch (up to float rounding), for a share of the network's work.
    """

    def __init__(self, device, precision, cuda_graph, group=None):
        self.device = device
        self.precision = precision
        self.group = group
        self.world_size = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.uses_graph = bool(cuda_graph) and device.type == "cuda"
        self.lock = cuda_rng_lock(device)
        self._streams = None
        self._graph = None
        self._eager_steps = 0
        self._exit = None
        self._norms = None

    def __enter__(self):
        stack = contextlib.ExitStack()
        stack.enter_context(precision_context(self.device, self.precision))
        if self.device.type == "cuda":
            self._streams = stack.enter_context(borrowed_streams(self.device))
            stack.enter_context(own_stream(self.device, self._streams[0]))
        self._exit = stack
        return self

    def __exit__(self, *exc_info):
        self._graph = None
        exit_stack, self._exit = self._exit, None
        return exit_stack.__exit__(*exc_info)

    def autocast(self):
        """Autocast for the networks' forward passes (never for the losses)."""
        return autocast_context(self.device, self.precision)

    def model_streams(self, n_models):
        """A CUDA stream for each of ``n_models`` models trained side by side.

        None for a single model or off a GPU: the models then run one after
        the other on the fit's stream. The streams are new ones of this fit
        (not the pool's): the models' branches of the captured graph must
        not share a stream with anything else captured meanwhile.
        """
        if n_models < 2 or self.device.type != "cuda":
            return None
        return [torch.cuda.Stream(self.device) for _ in range(n_models)]

    def run(self, step):
        """Run one training step: its host work, then the step itself.

        ``step`` has ``prefetch()`` (host work that must precede the step,
        outside any graph) and is called for the step's device work.
        """
        step.prefetch()
        norms = self._norms.installed() if self._norms else contextlib.nullcontext()
        with self.lock, norms:
            if not self.uses_graph:
                step()
            elif self._eager_steps < GRAPH_WARMUP_STEPS:
                self._eager_on_side_stream(step)
            else:
                if self._graph is None:
                    self._graph = self._capture(step)
                self._graph.replay()

    def _eager_on_side_stream(self, step):
        side = self._streams[1]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        self._eager_steps += 1

    def _capture(self, step):
        """Capture one training step as a CUDA graph.

        The step must have run eagerly a few times first (the warm-up), on
        a side stream: that allocates the optimizer state and lets cuDNN
        pick its kernels outside the capture.
        """
        step.zero_grad()
        graph = torch.cuda.CUDAGraph()
        # A capture stream of this fit's own (torch.cuda.graph's default one
        # is shared by all threads), and "thread_local" mode: fits in other
        # threads (GridSearchCV under the threading backend) may use CUDA
        # meanwhile.
        with torch.cuda.graph(
            graph, stream=self._streams[2], capture_error_mode="thread_local"
        ):
            step()
        return graph

    # ------------------------------------------------------ several processes

    def rows_of_this_process(self, x):
        """This process's share of the rows of ``x``, and every share's size.

        Consecutive shares in process order (their sizes differ by one at
        most), so that :meth:`gather_rows` puts the batch back in order.
        """
        # As torch.tensor_split shares rows: the first ones take one more.
        base, extra = divmod(len(x), self.world_size)
        sizes = [base + (rank < extra) for rank in range(self.world_size)]
        start = sum(sizes[: self.rank])
        return x[start : start + sizes[self.rank]], sizes

    def gather_rows(self, rows, sizes):
        """Every process's ``rows`` in process order, gradients flowing back.

        Collectives need equal shapes: shorter shares are padded with zeros
        and the padding cut off again.
        """
        longest = max(sizes)
        if len(rows) < longest:
            padding = rows.new_zeros((longest - len(rows), *rows.shape[1:]))
            rows = torch.cat([rows, padding])
        parts = _GatherRows.apply(rows, self.group, self.world_size, self.rank)
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    @contextlib.contextmanager
    def whole_batch_norms(self, models):
        """A context in whose steps (:meth:`run`) the batch norms of
        ``models`` normalise with the whole step's statistics, not a
        process's share's; nothing for one process. See
        :mod:`._sync_batch_norm`."""
        if self.world_size > 1:
            self._norms = WholeBatchNorms(
                models, self.device, self.group, self._gather_one_row_each
            )
        try:
            yield
        finally:
            self._norms = None

    def _gather_one_row_each(self, row):
        """Every process's ``row`` of shape ``(1, k)``, as ``(world_size, k)``."""
        return self.gather_rows(row, [1] * self.world_size)

    def average_gradients(self, params):
        """Average the gradients of ``params`` over the processes, in place.

        Every process computes the losses of the whole batch, so the gather's
        backward pass sums ``world_size`` equal gradients into each share's
        embeddings: the mean over the processes is then the gradient of the
        whole batch, for the embedder (whose shares add up) and for the
        logit layer (computed whole by every process) alike. One all-reduce
        of the gradients flattened together.
        """
        if self.world_size == 1:
            return
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat /= self.world_size
        torch._foreach_copy_(
            grads,
            [
                part.view_as(g)
                for part, g in zip(
                    flat.split([g.numel() for g in grads]), grads, strict=True
                )
            ],
        )

    def broadcast_parameters(self, model):
        """Give every process the weights and buffers of process 0."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(
                    tensor, src=dist.get_global_rank(self.group, 0), group=self.group
                )

    def any_process(self, *flags):
        """Whether any process has each of ``flags`` set (a host sync)."""
        if self.world_size == 1:
            return list(flags)
        values = torch.tensor([float(bool(f)) for f in flags], device=self.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(v) for v in values.tolist()]

    def synchronize(self):
        """Wait until the device has finished the steps queued so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class _GatherRows(torch.autograd.Function):
    """All-gather of equal-shaped rows, ``(world_size, *rows.shape)``, whose
    gradient is the sum over the processes of the gradient of each one's rows.

    torch's own autograd gather (``torch.distributed.nn.functional``) is
    deprecated, its successor private; this one all-reduces the gradient of
    the whole gathered batch (a few hundred embeddings) and keeps its rows.
    """

    @staticmethod
    def forward(ctx, rows, group, world_size, rank):
        ctx.group, ctx.rank = group, rank
        parts = [torch.empty_like(rows) for _ in range(world_size)]
        dist.all_gather(parts, rows.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None, None, None


def default_group():
    """The process group a fit trains with: the default group of
    ``torch.distributed`` when it is initialized with several processes
    (``torchrun``, or the caller's own ``init_process_group``), else None."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.group.WORLD if dist.get_world_size() > 1 else None


def check_backend(device, group):
    """Refuse a group whose backend cannot reduce tensors of ``device``
    (NCCL for a GPU fit, gloo for a CPU fit); nothing for one process.

    Raises
    ------
    ValueError
        If the backend does not serve ``device``'s type.
    """
    if group is None:
        return
    backend = str(dist.get_backend(group))
    needed = "nccl" if device.type == "cuda" else "gloo"
    if needed not in backend:
        raise ValueError(
            f"This fit runs on {device}, and torch.distributed's default group "
            f"(backend {backend!r}) would train it data-parallel with the other "
            f"{dist.get_world_size(group) - 1} processes, which needs the "
            f"{needed!r} backend for {device.type} tensors. Initialize the group "
            f"with backend={needed!r} (or 'cpu:gloo,cuda:nccl'), or fit on the "
            "device the backend serves."
        )


def agreed_seed(seed, group):
    """Process 0's ``seed``: every process must draw the same batches."""
    shared = [int(seed)]
    dist.broadcast_object_list(shared, src=0, group=group)
    return shared[0]


@contextlib.contextmanager
def raised_together(group, what):
    """Run a block of per-process work (checks, setup) before a collective,
    so that if it raises in any process of ``group``, it raises in all.

    The failing process raises its own error; the others a ``ValueError``
    that names it and ``what`` it failed. Without this, a process that
    raised before the next collective would leave the others waiting there
    (gloo's and NCCL's timeouts are many minutes). Only exceptions
    (``Exception``) are agreed on: a Ctrl-C reaches every process anyway
    (``devices`` forwards it; a terminal's reaches every torchrun process).
    """
    if group is None:
        yield
        return
    try:
        yield
    except Exception:
        # If the agreement fails too (a peer gone), this error is the news.
        with contextlib.suppress(Exception):
            _agree(True, group, what)
        raise
    _agree(False, group, what)


@contextlib.contextmanager
def computed_by_process_0(group, compute):
    """A context whose value is ``compute()``, run by process 0 of
    ``group`` alone and given to every process (without a group: just
    ``compute()``).

    For work after training whose result every process needs and would
    compute alike from the same model (the class frequencies, the fit's
    report): the others' CPUs are spared, and all hold the same result.
    Use the value inside the block (set the fitted state there): a Ctrl-C
    that comes while the processes exchange it is held back until the block
    ends, so that no process is stopped between the exchange's collectives
    or before it holds its state. ``compute`` itself stays interruptible.

    Raises
    ------
    BaseException
        In process 0, whatever ``compute`` raised; in the others, a
        ``RuntimeError`` that says process 0 failed.
    """
    if group is None:
        yield compute()
        return
    source = dist.get_global_rank(group, 0)
    payload = [None]
    if dist.get_rank(group) == 0:
        try:
            payload = [(True, compute())]
        except BaseException:
            # The others wait for the result: tell them there is none.
            with contextlib.suppress(Exception), sigint_deferred():
                dist.broadcast_object_list([(False, None)], src=source, group=group)
            raise
    with sigint_held_back():
        dist.broadcast_object_list(payload, src=source, group=group)
        computed, value = payload[0]
        if not computed:
            raise from_another_process(
                RuntimeError(
                    "Process 0 of the group failed after training, computing "
                    "what every process's fitted state needs (its error is "
                    "raised there)."
                )
            )
        yield value


def _agree(failed, group, what):
    flags = [None] * dist.get_world_size(group)
    dist.all_gather_object(flags, failed, group=group)
    if failed or not any(flags):
        return
    peers = [rank for rank, flag in enumerate(flags) if flag]
    raise from_another_process(
        ValueError(
            f"This fit stopped before training: processes {peers} of the group "
            f"failed {what} (their error is raised there)."
        )
    )


def from_another_process(error):
    """Mark ``error`` as this process's news of another's failure:
    ``devices=[...]`` raises the original error in the caller, not this
    (see :func:`is_from_another_process`)."""
    error.from_another_process = True
    return error


def is_from_another_process(error):
    """Whether :func:`from_another_process` marked ``error``."""
    return getattr(error, "from_another_process", False)


def check_same_everywhere(summary, group, what):
    """Refuse processes whose ``summary`` differs from process 0's.

    ``summary`` is a small picklable description (shapes and hashes) of
    ``what`` every process of a data-parallel fit must share.
    """
    summaries = [None] * dist.get_world_size(group)
    dist.all_gather_object(summaries, summary, group=group)
    differing = [rank for rank, other in enumerate(summaries) if other != summaries[0]]
    if differing:
        raise ValueError(
            f"The processes of this data-parallel fit were given different "
            f"{what} (processes {differing} differ from process 0). Under "
            f"torchrun every process calls fit with the same {what}; to fit "
            "each process on its own, fit outside the process group "
            "(torch.distributed.destroy_process_group())."
        )
