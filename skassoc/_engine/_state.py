"""What continuing a run needs beyond the weights, captured and put back.

A fit keeps a :class:`TrainingState` for its model (``training_state_``):
Adam's moments, the step count that drives the schedule and the loss ramp,
the moving average of the weights, the balance loss's running estimate, and
the random streams that draw the batches and augmentations. A warm-started
fit (or one loaded from a checkpoint) puts it back and continues the run
where it ended, so that a fit of ``2N`` steps and a fit of ``N`` steps
continued for ``N`` more train the same model (bitwise on a CPU).

Tensors are kept on the CPU, keyed by parameter name: the state outlives
the fit's device and travels in a model file (``skassoc._io``).
"""

from dataclasses import dataclass, field

import torch

from ._device import cuda_rng_lock

__all__ = ["TrainingState", "capture_state", "restore_states"]


@dataclass(frozen=True)
class TrainingState:
    """The state of one model's run after ``n_iter`` steps.

    Attributes
    ----------
    n_iter : int
        Steps of the run so far (the schedule's position).
    adam_step : float
        Adam's step count (equal to ``n_iter`` unless the run started from
        the weights of an earlier one).
    exp_avg, exp_avg_sq : dict of str to torch.Tensor
        Adam's first and second moments, by parameter name.
    average : dict of str to torch.Tensor or None
        The moving average of the weights (``ema_decay``), by parameter name.
    weights : dict of str to torch.Tensor or None
        With a moving average, the trained weights (the model holds the
        averaged ones); None otherwise.
    class_mass : torch.Tensor or None
        The balance loss's running estimate of the class mass.
    rng : dict of str to torch.Tensor
        torch's CPU generator state (``"cpu"``) and, after a GPU fit, the
        CUDA generator's (``"cuda"``).
    sampler : dict
        The unlabeled sampler's state (shuffled epochs only; empty otherwise).
    """

    n_iter: int
    adam_step: float
    exp_avg: dict
    exp_avg_sq: dict
    average: dict | None = None
    weights: dict | None = None
    class_mass: torch.Tensor | None = None
    rng: dict = field(default_factory=dict)
    sampler: dict = field(default_factory=dict)


def _cpu(tensor):
    return tensor.detach().to("cpu", copy=True)


def capture_state(step, k, n_iter):
    """The :class:`TrainingState` of model ``k`` of ``step`` after ``n_iter`` steps.

    Reads device tensors back (a host synchronisation): call it between
    steps, never inside one.
    """
    model = step.models[k]
    names = [name for name, _ in model.named_parameters()]
    start, end = step.param_ranges[k]
    params = step.params[start:end]
    optimizer_state = step.optimization.optimizer.state
    moments = [optimizer_state.get(p, {}) for p in params]
    if any("exp_avg" not in moment for moment in moments):
        return None  # no step taken yet
    average = weights = None
    if step.average is not None:
        average = {n: _cpu(t) for n, t in zip(names, step.average.average[start:end])}
        weights = {n: _cpu(p) for n, p in zip(names, params)}
    class_mass = step.losses[k].frequencies.class_mass
    device = step.runner.device
    with cuda_rng_lock(device):
        rng = {"cpu": torch.get_rng_state()}
        if device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(device)
    return TrainingState(
        n_iter=int(n_iter),
        adam_step=float(moments[0]["step"]),
        exp_avg={n: _cpu(m["exp_avg"]) for n, m in zip(names, moments)},
        exp_avg_sq={n: _cpu(m["exp_avg_sq"]) for n, m in zip(names, moments)},
        average=average,
        weights=weights,
        class_mass=None if class_mass is None else _cpu(class_mass),
        rng=rng,
        sampler=step.batches.sampler.state_dict(),
    )


@torch.no_grad()
def restore_states(step, states):
    """Put back each model's :class:`TrainingState` (None: a fresh start).

    Called before the first step of a continued run. Every state belongs to
    the same run (stacked candidates share their batches), so the random
    streams and the sampler come from the first one.
    """
    present = [state for state in states if state is not None]
    if not present:
        return
    for k, state in enumerate(states):
        if state is not None:
            _restore_model(step, k, state)
    first = present[0]
    device = step.runner.device
    with cuda_rng_lock(device):
        torch.set_rng_state(first.rng["cpu"])
        if device.type == "cuda" and "cuda" in first.rng:
            torch.cuda.set_rng_state(first.rng["cuda"], device)
    step.batches.sampler.load_state_dict(first.sampler)
    step.step_count.fill_(first.n_iter)


def _restore_model(step, k, state):
    model = step.models[k]
    named = list(model.named_parameters())
    start, _ = step.param_ranges[k]
    optimizer = step.optimization.optimizer
    group_of = {
        id(p): group for group in optimizer.param_groups for p in group["params"]
    }
    for offset, (name, param) in enumerate(named):
        if state.weights is not None:
            param.copy_(state.weights[name])
        if step.average is not None and state.average is not None:
            step.average.average[start + offset].copy_(state.average[name])
        group = group_of[id(param)]
        # Where Adam keeps its step count (see torch.optim.Adam._init_group).
        on_device = group["capturable"] or group["fused"]
        optimizer.state[param] = {
            "step": torch.tensor(
                state.adam_step,
                dtype=torch.float32,
                device=param.device if on_device else "cpu",
            ),
            # Copies in the parameter's layout: fused Adam needs the moments
            # to match it (channels-last convolution weights), and the
            # state's tensors must stay as they are.
            "exp_avg": torch.empty_like(param).copy_(state.exp_avg[name]),
            "exp_avg_sq": torch.empty_like(param).copy_(state.exp_avg_sq[name]),
        }
    class_mass = step.losses[k].frequencies.class_mass
    if class_mass is not None and state.class_mass is not None:
        class_mass.copy_(state.class_mass)
