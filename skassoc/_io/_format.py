"""What a model file is: a file that holds no pickle and runs nothing.

A model file (format 3) is one zip archive, starting at its first byte, with
two members and no others:

``metadata.json``
    The format name and version, the skassoc and torch versions that wrote
    it, the estimator's hyperparameters and output configuration
    (``set_output``), the network's description, the classes and the class
    frequencies that predictions assume, the training history and the
    SHA-256 of ``weights.safetensors``.
``weights.safetensors``
    The network's ``state_dict`` on the CPU in the safetensors format,
    stored uncompressed.

What a file may do when it is loaded, and what it may not:

- It is read as data: JSON, and tensors through safetensors; nothing in it
  is imported, executed or unpickled.
- It describes a built-in network only. The description is checked against
  limits, and the names, shapes and dtypes in the weights' header against
  the network built on torch's meta device (which allocates nothing),
  *before* any tensor is read; so a small file cannot make the process
  allocate much more than its own size. Weights must be finite float32
  tensors (integer counters of batch norm aside).
- Each hyperparameter is taken only from a safe list, each within a bounded
  domain (see ``_limits``), and together they may not ask a refit for more
  than a budget of memory and work (see ``_refit_cost``). ``compile`` and
  ``device``, which reach a compiler and the hardware, are never taken from
  a file: ``compile`` is off and ``device`` is ``load``'s argument; a file
  that sets them gets a warning.

Files of formats 1 and 2 stored the weights with :func:`torch.save`, whose
reader unpickles; ``load_model`` refuses them, and ``convert_model_file``
converts them once, reading the old weights without unpickling (see
``_legacy``).
"""

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "METADATA_MEMBER",
    "WEIGHTS_MEMBER",
    "LEGACY_WEIGHTS_MEMBER",
    "InvalidModelFile",
]

FORMAT_NAME = "skassoc-model"
#: Bump on any change that an older skassoc could not read correctly.
#: Version 2 added the class frequencies (``class_prior``); version 3 stores
#: the weights as safetensors instead of a torch pickle, and the output
#: configuration of ``set_output``.
FORMAT_VERSION = 3
METADATA_MEMBER = "metadata.json"
# Why safetensors: its reader has no code path at all (a JSON header of
# names, dtypes, shapes and byte offsets, then the raw bytes), it has no
# strides or views (a tensor is exactly its bytes, so a small file cannot
# claim a large tensor), and it checks every offset against the buffer.
# NumPy's npz with allow_pickle=False is pickle-free too, but it is a zip
# of .npy files inside our zip, each with a header that allows any dtype,
# Fortran order and object arrays (refused only by a flag).
WEIGHTS_MEMBER = "weights.safetensors"
#: Where files of formats 1 and 2 kept their torch.save weights.
LEGACY_WEIGHTS_MEMBER = "weights.pt"


class InvalidModelFile(Exception):
    """Why a file is not a valid model file; load_model adds the file name."""
