"""Early stopping: the best-scoring weights of a run, and when to stop it."""

import math

import torch

__all__ = ["BestWeights"]


class BestWeights:
    """Keeps a copy of the best-scoring weights and counts validations since.

    Mirrors :class:`~sklearn.neural_network.MLPClassifier`'s early stopping:
    a score counts as an improvement when it beats the best by at least
    ``tol``; training should stop after ``n_iter_no_change`` validations
    in a row without one. The weights are copied whenever a score beats the
    best at all. Copies are host-side operations between steps: the
    parameters keep their addresses (a captured CUDA graph holds them).

    Parameters
    ----------
    model : torch.nn.Module
        The model being trained; its parameters and buffers are copied.
    n_iter_no_change : int
        Validations without improvement before stopping.
    tol : float
        Smallest gain in score that counts as an improvement.
    """

    def __init__(self, model, n_iter_no_change, tol):
        self.tensors = list(model.state_dict(keep_vars=True).values())
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.best_score = -math.inf
        self.best_step = None
        self.no_improvement = 0
        self._copy = None

    @torch.no_grad()
    def update(self, score, step):
        """Record the score of the model's current weights; True: stop now."""
        if score < self.best_score + self.tol:
            self.no_improvement += 1
        else:
            self.no_improvement = 0
        if score > self.best_score:
            self.best_score, self.best_step = score, step
            if self._copy is None:
                self._copy = [tensor.detach().clone() for tensor in self.tensors]
            else:
                for saved, tensor in zip(self._copy, self.tensors, strict=True):
                    saved.copy_(tensor)
        return self.no_improvement >= self.n_iter_no_change

    @torch.no_grad()
    def restore(self):
        """Give the model the best weights seen (nothing before any score)."""
        if self._copy is None:
            return
        for tensor, saved in zip(self.tensors, self._copy, strict=True):
            tensor.copy_(saved)
