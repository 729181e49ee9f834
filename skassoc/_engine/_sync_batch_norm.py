"""Batch norm over the whole batch of a data-parallel step.

In a data-parallel fit each process embeds a share of the step's batch. A
network with batch norm (the STL-10 network) would normalise each share
with statistics of its own, and so train another model than one process on
the whole batch. In each training step of such a fit, its batch norms give
way to stand-ins that normalise every share with the statistics of the
whole batch, gathered from every process (their gradients flow back to
every process's rows). Between the steps the network holds its own batch
norms again: callbacks, and the fitted model, see those.

On GPUs the stand-in is torch's ``nn.SyncBatchNorm``, with fused kernels:
:class:`GroupBatchNorm`, written here with torch's plain operations, made
a two-GPU step of the STL-10 network slower than a one-GPU step, where
``SyncBatchNorm`` makes it faster (the STL-10 rows of
``benchmarks/results/multi_gpu_cuda_x2_plain_ops.rst`` and
``multi_gpu_cuda_x2.rst``). ``SyncBatchNorm`` refuses CPU tensors, so a
gloo group (and the CPU test that checks a group against one process)
gets :class:`GroupBatchNorm`. Both hold the very parameters and buffers
(and hooks) of the batch norm they stand in for, so the optimizer, the
moving average and the processes' weight broadcast see no change.
"""

import contextlib

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["WholeBatchNorms", "check_batch_norms"]

#: The batch norms a data-parallel fit can give the whole batch's statistics.
_PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class GroupBatchNorm(_BatchNorm):
    """A batch norm whose training statistics are the whole batch's, for
    processes on CPUs (see the module's docstring).

    Parameters
    ----------
    gather : callable
        ``gather(rows)``: every process's ``rows`` of shape ``(1, k)``,
        stacked in process order into ``(world_size, k)``, with gradients
        flowing back to each process's own rows (the device runner's
        gather).
    **options
        Those of the batch norm it stands in for.
    """

    def __init__(self, gather, **options):
        super().__init__(**options, device="meta")
        self.gather = gather

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self._check_input_dim(x)
        mean, var, count = self._whole_batch_moments(x)
        if self.track_running_stats:
            self._update_running_stats(mean, var, count)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        scale = torch.rsqrt(var + self.eps)
        if self.affine:
            scale = scale * self.weight
        out = (_at_least_float32(x) - mean.view(shape)) * scale.view(shape)
        if self.affine:
            out = out + self.bias.view(shape)
        return out.to(x.dtype)

    def _whole_batch_moments(self, x):
        """The channels' mean and (biased) variance over every process's
        rows, and the whole batch's count per channel.

        Each process sends its count, mean and sum of squared deviations;
        they are combined as Chan et al.'s parallel variance does, which
        stays accurate where the mean is large next to the spread.
        """
        x = _at_least_float32(x)
        dims = [0] + list(range(2, x.dim()))
        count = x.new_full((1,), x.numel() // x.shape[1])
        local_var, local_mean = torch.var_mean(x, dims, correction=0)
        # A process with no rows sends zeros (its count weighs them out);
        # torch.where keeps a NaN of a diverged step, which must show.
        empty = count == 0
        local_mean = torch.where(empty, 0.0, local_mean)
        local = torch.cat(
            [count, local_mean, torch.where(empty, 0.0, local_var * count)]
        )
        parts = self.gather(local.unsqueeze(0))
        counts, means, m2s = parts.split([1, self.num_features, self.num_features], 1)
        total = counts.sum()
        mean = (counts * means).sum(0) / total
        m2 = m2s.sum(0) + (counts * (means - mean).square()).sum(0)
        return mean, m2 / total, total

    @torch.no_grad()
    def _update_running_stats(self, mean, var, count):
        """As torch's batch norm updates them: the unbiased variance,
        momentum (or the cumulative average when ``momentum`` is None)."""
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / self.num_batches_tracked
        else:
            factor = self.momentum
        unbiased = var * count / (count - 1).clamp(min=1)
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)


def _at_least_float32(x):
    """``x`` in float32, or in its own dtype if wider (bf16 activations are
    normalised in float32, as torch's batch norm does)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _options(norm):
    """The constructor arguments of a batch norm like ``norm``."""
    return dict(
        num_features=norm.num_features,
        eps=norm.eps,
        momentum=norm.momentum,
        affine=norm.affine,
        track_running_stats=norm.track_running_stats,
    )


#: A module's hook registries: a stand-in shares its batch norm's, so that
#: hooks on the network's layers run in the eager steps of a data-parallel
#: fit (the replays of a captured CUDA graph run no Python, as in one process).
_HOOKS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def _holding_state_of(source, target):
    """``target``, made to hold ``source``'s parameter and buffer tensors
    and to run its hooks."""
    for name, param in source.named_parameters(recurse=False):
        setattr(target, name, param)
    for name, buffer in source.named_buffers(recurse=False):
        target.register_buffer(name, buffer)
    for name in _HOOKS:
        setattr(target, name, getattr(source, name))
    return target.train(source.training)


def check_batch_norms(model):
    """Refuse batch norms that a data-parallel fit cannot synchronise.

    Raises
    ------
    ValueError
        If ``model`` holds a batch norm other than a plain ``nn.BatchNorm1d``,
        ``2d`` or ``3d``: a subclass, a lazy one, or torch's ``SyncBatchNorm``
        (whose group need not be the fit's).
    """
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) and type(module) not in _PLAIN:
            raise ValueError(
                f"Layer {name!r} of the network is a {type(module).__name__}, "
                "which a fit over several processes cannot give the whole "
                "batch's statistics. Use a plain nn.BatchNorm1d, 2d or 3d "
                "(the fit gives those the whole batch's statistics itself), "
                "or fit on one device."
            )


class WholeBatchNorms:
    """The batch norms of ``models`` and their stand-ins, which normalise
    with the whole batch's statistics: installed for each training step
    (:meth:`installed`), so that callbacks between the steps, and the
    fitted model, see the network's own modules.

    Parameters
    ----------
    models : list of nn.Module
        Checked by :func:`check_batch_norms`.
    device : torch.device
        The fit's: ``nn.SyncBatchNorm`` on a GPU, :class:`GroupBatchNorm`
        elsewhere.
    group : torch.distributed.ProcessGroup
        The fit's processes.
    gather : callable
        See :class:`GroupBatchNorm`.
    """

    def __init__(self, models, device, group, gather):
        # The gather is a collective: torch.compile leaves it out of its
        # graphs.
        gather = torch.compiler.disable(gather)
        # (parent, name, norm, stand-in), made once: installing them is then
        # a few attribute writes a step, and the same stand-ins each step
        # keep torch.compile's guards on the modules valid.
        self.swaps = []
        for model in models:
            for parent in model.modules():
                for name, child in parent.named_children():
                    if type(child) in _PLAIN:
                        stand_in = _stand_in(child, device, group, gather)
                        self.swaps.append((parent, name, child, stand_in))

    @contextlib.contextmanager
    def installed(self):
        """The stand-ins in place of the batch norms until the context ends
        (however it ends)."""
        for parent, name, norm, stand_in in self.swaps:
            # The model's mode may have changed since (model.train()), and
            # hooks may have been registered (whether the backward hooks
            # are "full" ones is a flag, not in the shared registries).
            stand_in._is_full_backward_hook = norm._is_full_backward_hook
            setattr(parent, name, stand_in.train(norm.training))
        try:
            yield
        finally:
            for parent, name, norm, _ in self.swaps:
                setattr(parent, name, norm)


def _stand_in(norm, device, group, gather):
    """The module that normalises as ``norm`` with the whole batch's
    statistics, holding ``norm``'s tensors."""
    if device.type == "cuda":
        new = nn.SyncBatchNorm(**_options(norm), process_group=group, device="meta")
    else:
        new = GroupBatchNorm(gather, **_options(norm))
    return _holding_state_of(norm, new)
