"""The engine's aborts: the GGML_ASSERTs of llama.cpp that kpool's model reaches
(ENGINE.md §8, KP005). One home for them all, so the replay catches one type.

Owns: `EngineAbort` (its message names the assert and why it fails), raised by the
cache (`KeepTailAssert` in the split, `RecurrentAssert` in the recurrent child) and
by the engine (edits, marking, the scatter plan). An abort ends the replay, as the
process would end.
"""

from __future__ import annotations


class EngineAbort(Exception):
    """A GGML_ASSERT the real engine would hit here (KP005); the replay stops."""


class KeepTailAssert(EngineAbort):
    """GGML_ASSERT(n_ubatch > n_keep_tail) in llama_batch_allocr::split_equal."""


class RecurrentAssert(EngineAbort):
    """A GGML_ASSERT of llama_memory_recurrent (find_slot on a dangling tail)."""
