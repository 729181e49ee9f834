"""The embedding networks, their registry and the model that wraps them."""
