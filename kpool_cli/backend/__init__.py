"""Value backends: key rows, pooling, scatter and gather (numba, and a numpy twin)."""
