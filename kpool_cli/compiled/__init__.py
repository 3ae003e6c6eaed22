"""The compiled replay core (`--core compiled`): the reference core's state and rules
(cache/, engine/), with its per-ubatch steps, find_slot, the writes and their
index, the layout update, marking, the scatter plan and the race groups, running as
numba kernels (compiled/kernels.py) over the same arrays.

Owns: the compiled classes and functions the replay picks with `--core compiled`
(replay.py `CORES`). Imported only when a replay runs this core, so nothing else
loads numba for it. Invariant: for every trace, version and backend its records are
the reference core's, byte for byte in every report (tests/test_cores.py).
"""
