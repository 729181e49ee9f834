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

from ._device import (
    autocast_context,
    borrowed_streams,
    cuda_rng_lock,
    own_stream,
    precision_context,
)

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
    """

    def __init__(self, device, precision, cuda_graph):
        self.device = device
        self.precision = precision
        self.uses_graph = bool(cuda_graph) and device.type == "cuda"
        self.lock = cuda_rng_lock(device)
        self._streams = None
        self._graph = None
        self._eager_steps = 0
        self._exit = None

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
        with self.lock:
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

    def synchronize(self):
        """Wait until the device has finished the steps queued so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
