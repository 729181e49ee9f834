"""The training engine: one association step for K >= 1 models, the loop
that runs it with callbacks between steps, and the device runner."""
