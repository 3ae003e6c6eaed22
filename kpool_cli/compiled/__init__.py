"""The compiled replay core (`--core compiled`): the reference core's state and rules
(cache/, engine/), with its per-ubatch steps, find_slot, the writes and their
index, the layout update, marking, the scatter plan and the race groups, running as
numba kernels (compiled/kernels.py) over the same cell arrays and over arenas of
every sequence's index and layout columns (compiled/arena.py).

Owns: the compiled classes and functions the replay picks with `--core compiled`
(replay.py `CORES`). Its kernels are imported only when a replay runs this core, so
nothing else loads numba for it (the memory bound reads `arena.py`, which holds
none). Invariant: for every trace, version and backend its records are
the reference core's, byte for byte in every report (tests/test_cores.py).
"""
