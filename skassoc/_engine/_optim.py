"""Adam and its learning-rate schedule: building them, and starting them again.

The paper trains with Adam, its L2 penalty carried as Adam's (coupled)
weight decay, and a learning rate that falls by a factor every few thousand
steps. On a GPU the optimizer runs inside the captured CUDA graph, so its
learning rate is a device tensor that the scheduler updates in place.
"""

import contextlib
import importlib
import math
import signal
import sys
import threading

import torch

from .._nn._networks import weight_tensors

__all__ = [
    "LR_SCHEDULES",
    "LearningRateFactor",
    "Optimization",
    "parameter_groups",
    "load_torch_dynamo",
    "sigint_deferred",
    "sigint_held_back",
]

#: The values of the estimator's ``lr_schedule`` (see LearningRateFactor).
LR_SCHEDULES = ("step", "cosine")


def parameter_groups(models, config):
    """Adam parameter groups carrying the paper's L2 penalty as weight decay.

    Adam's (coupled) ``weight_decay`` adds ``scale * w`` to the gradient,
    which is exactly the gradient of the paper's ``scale * sum(w**2) / 2``
    term (:func:`skassoc._engine._losses.l2_penalty`), without the dozens of
    small kernels that computing the term in the loss costs every step.
    Adam acts element by element, so one optimizer over several models is
    one optimizer per model.
    """
    groups, undecayed = {}, []
    for model in models:
        weights, scales = weight_tensors(model, config.l2_scale, config.logit_l2_scale)
        decayed = {id(weight) for weight in weights}
        for weight, scale in zip(weights, scales, strict=True):
            groups.setdefault(scale, []).append(weight)
        undecayed += [p for p in model.parameters() if id(p) not in decayed]
    groups = [
        {"params": params, "weight_decay": scale} for scale, params in groups.items()
    ]
    if undecayed:
        groups.append({"params": undecayed, "weight_decay": 0.0})
    return groups


class LearningRateFactor:
    """The learning rate's multiplier at each (0-based) step of a run.

    A linear warm-up, ``(step + 1) / lr_warmup_steps`` over the first
    ``lr_warmup_steps`` steps, times ``"step"``: a factor of ``lr_decay``
    every ``lr_decay_steps`` steps counted from step 0 (the paper's
    schedule), or ``"cosine"``: half a cosine from 1 after the warm-up down
    to 0 at step ``max_iter``, one step after the last.
    """

    def __init__(self, config):
        self.schedule = config.lr_schedule
        self.warmup_steps = config.lr_warmup_steps
        self.decay, self.decay_steps = config.lr_decay, config.lr_decay_steps
        self.max_iter = config.max_iter

    def __call__(self, step):
        warmup = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        if self.schedule == "cosine":
            after_warmup = max(0, step - self.warmup_steps)
            progress = after_warmup / max(1, self.max_iter - self.warmup_steps)
            return warmup * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return warmup * self.decay ** (step // self.decay_steps)


class Optimization:
    """Adam over ``groups`` and torch's ``LambdaLR`` following the schedule.

    Parameters
    ----------
    groups : list of dict
        Parameter groups (:func:`parameter_groups`).
    config : TrainingConfig
        The learning rate and its schedule.
    device : torch.device
    capturable : bool
        Whether the update runs inside a captured CUDA graph: the rate is
        then a device tensor that the graph reads on every replay.
    start : int, default=0
        Steps already trained (a continued run): the schedule starts there.
    """

    def __init__(self, groups, config, device, capturable, start=0):
        # Adam's first use imports torch._dynamo: whole, even on a Ctrl-C.
        load_torch_dynamo()
        if capturable:
            # The fused kernel updates every parameter in one launch.
            self.optimizer = torch.optim.Adam(
                groups,
                lr=torch.tensor(config.learning_rate, device=device),
                capturable=True,
                fused=True,
            )
        else:
            self.optimizer = torch.optim.Adam(
                groups, lr=config.learning_rate, fused=config.fused_adam or None
            )
        self._lr_tensors = [group["lr"] for group in self.optimizer.param_groups]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, LearningRateFactor(config)
        )
        # Before torch 2.4 the scheduler keeps the optimizer's tensor rate
        # itself as its base rate (pytorch#126854), and _keep_lr_tensor
        # writes each step's rate into that tensor: the factors would
        # compound. Plain floats do not.
        self.scheduler.base_lrs = [float(rate) for rate in self.scheduler.base_lrs]
        if start:
            self._start_at(start)

    def _start_at(self, start):
        """Put the schedule at step ``start``, as if it had run that far.

        Set directly rather than by calling ``scheduler.step()`` ``start``
        times: torch warns about a scheduler step before any optimizer step.
        """
        factor = self.scheduler.lr_lambdas[0]
        rates = [base * factor(start) for base in self.scheduler.base_lrs]
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        self.scheduler.last_epoch = start
        self.scheduler._last_lr = rates
        self._keep_lr_tensor()

    @property
    def learning_rate(self):
        """The current rate as a float (a tensor rate is read back)."""
        return float(self.scheduler.get_last_lr()[0])

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)

    def step(self):
        """Update the weights (inside the step, and the captured graph)."""
        self.optimizer.step()

    def next_rate(self):
        """Move the schedule on by a step (on the host, between steps)."""
        self.scheduler.step()
        self._keep_lr_tensor()

    def _keep_lr_tensor(self):
        """Older torch schedulers replace a tensor lr by a new object: the
        captured graph reads the old one, so copy the rate back into it."""
        for group, lr in zip(self.optimizer.param_groups, self._lr_tensors):
            if isinstance(lr, torch.Tensor) and group["lr"] is not lr:
                lr.fill_(float(group["lr"]))
                group["lr"] = lr


def load_torch_dynamo():
    """Import ``torch._dynamo`` whole, holding back a Ctrl-C until it is done.

    torch imports it, and sympy with it, lazily: the first time a process
    builds an optimizer or runs a network on the meta device, early in its
    first fit, and it is a large import. One cut short leaves the
    submodules it had finished in ``sys.modules`` but not bound to their
    package, and every later import of ``torch._dynamo`` in the process
    fails (``module 'sympy' has no attribute 'printing'``). So an interrupt
    that comes during the import is delivered once it has ended.

    Raises
    ------
    RuntimeError
        If the import fails where an earlier one, outside skassoc, was cut
        short (it left parts of ``torch._dynamo`` or sympy in
        ``sys.modules``): only a new Python process imports it again. Any
        other failure propagates as it is.
    """
    if "torch._dynamo" in sys.modules:
        return
    # Taken before the import, which itself leaves its finished submodules
    # behind when it fails for another reason.
    leftovers = _half_imported_modules()
    try:
        with sigint_held_back():
            importlib.import_module("torch._dynamo")
    except Exception as exc:
        if not leftovers:
            raise
        raise RuntimeError(
            "torch cannot import torch._dynamo, which its optimizers use "
            f"({type(exc).__name__}: {exc}). An earlier import of it (or of "
            "sympy) in this Python process was interrupted, e.g. by a Ctrl-C, "
            f"and left modules half imported ({', '.join(leftovers[:3])}). "
            "Restart the Python process (or the notebook's kernel) and fit again."
        ) from exc


def _half_imported_modules():
    """The modules that a cut-short import of ``torch._dynamo`` left behind.

    Submodules of ``torch._dynamo`` without the package itself, or sympy
    submodules without sympy or not bound to it (its attribute missing): an
    import that ended normally leaves neither.
    """
    dynamo = sorted(name for name in sys.modules if name.startswith("torch._dynamo."))
    sympy = sys.modules.get("sympy")
    parts = {name.split(".")[1] for name in sys.modules if name.startswith("sympy.")}
    unbound = sorted(
        f"sympy.{part}" for part in parts if sympy is None or not hasattr(sympy, part)
    )
    return dynamo + unbound


@contextlib.contextmanager
def sigint_deferred():
    """Record a Ctrl-C (SIGINT) during the block instead of raising it.

    Yields the list the handler appends to: the caller raises
    ``KeyboardInterrupt`` where it is safe (the training loop, between two
    steps). Python runs signal handlers in the main thread only, so in
    another thread (or under a handler set outside Python) nothing changes.
    """
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if in_main_thread else None
    received = []
    if previous is None:
        yield received
        return
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def sigint_held_back():
    """Deliver a Ctrl-C (SIGINT) that comes during the block when it ends."""
    with sigint_deferred() as received:
        yield
    if received:
        signal.raise_signal(signal.SIGINT)
