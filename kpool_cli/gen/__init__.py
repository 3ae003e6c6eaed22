"""Trace generators: realistic scenarios (`gen.scenarios`, the registry `SCENARIOS`
that `kpool gen` reads) and random valid traces (`gen.random_trace`).

Every generator is a pure function of a seed and plain integer sizes, so a trace is
reproducible from its `description` and can be built in any process."""
