"""Callbacks: code that runs between training steps.

Pass a list to the estimator's ``callbacks`` parameter. A callback has some
of the hooks ``on_fit_begin``, ``on_log`` and ``on_fit_end`` (subclass
:class:`Callback`); each receives the :class:`TrainingRun` of the model
being trained. They run on the host between steps, never inside the captured
CUDA graph. ``on_log`` comes at every log point: every ``log_interval``
steps (about 100 times a fit), every ``validation_interval`` steps when the
fit validates, and after the last step.

A model file never carries callbacks, and a search clones them with the
estimator (each fit gets its own copies).
"""

from ._engine._callback import Callback, TrainingRun
from ._io._checkpoint import Checkpoint
from ._tensorboard import TensorBoard

__all__ = ["Callback", "TrainingRun", "Checkpoint", "TensorBoard"]
