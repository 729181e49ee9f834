"""What the built-in networks share: the paper's initialisation, the MLP's widths."""

from itertools import pairwise

from torch import nn

__all__ = ["mlp_layers", "xavier_init_"]


def xavier_init_(module):
    """Xavier-uniform weights and zero biases, the TF-slim default the paper used.

    The paper's MNIST numbers depend on it: with PyTorch's default init the
    same recipe becomes unstable (the paper and the authors' code).
    """
    for layer in module.modules():
        if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return module


def mlp_layers(n_features, hidden_layer_sizes, embedding_dim):
    """``(in, out)`` widths of the MLP's linear layers, the embedding last."""
    return list(pairwise([n_features, *hidden_layer_sizes, embedding_dim]))
