"""`kpool diff`: what one engine version does differently from another on the same work.

- `summary`: one run (a live replay or a saved JSON report) normalised to plain data:
  per-ubatch summaries and per-op events. Both sources end up as the same `RunSummary`.
- `compare`: the pure comparison of two `RunSummary`s of one trace, a frozen `TraceDiff`,
  and `DiffResult` (several traces), which owns the exit policy.
- `runs`: the units of work (one trace under one engine, picklable), and `gather`, the
  command line's inputs as (base, head) pairs.
- `reports`: saved reports as untrusted input: told from traces, read with bounds,
  checked field by field (errors name the file, the line and column, and the JSON path).

The views are in `kpool_cli.report.diff_view`.
"""
