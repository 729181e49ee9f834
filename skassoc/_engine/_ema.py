"""An exponential moving average of a model's weights, kept on the device."""

import contextlib

import torch

__all__ = ["WeightAverage"]


class WeightAverage:
    """The moving average ``avg <- avg + (1 - decay) * (w - avg)`` of ``params``.

    Every operation works in place on device tensors, so :meth:`update` can
    run inside a captured CUDA graph (which holds the parameters' addresses).

    Parameters
    ----------
    params : list of torch.Tensor
        The parameters to average, updated by the optimizer.
    decay : float
        Share of the average kept at every update.
    """

    def __init__(self, params, decay):
        self.params = params
        self.decay = decay
        self.average = [param.detach().clone() for param in params]
        self._current = None

    @torch.no_grad()
    def update(self):
        """Move the average towards the current weights (one training step)."""
        torch._foreach_lerp_(self.average, self.params, 1.0 - self.decay)

    @torch.no_grad()
    def copy_to_params(self):
        """Make the average the model's weights, for good."""
        torch._foreach_copy_(self.params, self.average)

    @contextlib.contextmanager
    def swapped_in(self, start=0, end=None):
        """The average stands in for the weights ``start:end`` (all by
        default) until the context ends."""
        params, average = self.params[start:end], self.average[start:end]
        with torch.no_grad():
            # One buffer for the current weights, kept for the next swap.
            if self._current is None:
                self._current = [param.detach().clone() for param in self.params]
            current = self._current[start:end]
            torch._foreach_copy_(current, params)
            torch._foreach_copy_(params, average)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(params, current)
