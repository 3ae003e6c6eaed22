"""Finding codes (ENGINE.md §8): one module per code in `rules/`, each holding the
code, its explanation and its check; the registry (`codes.py`) and `kpool explain`
(`explain.py`) derive from them. The checks run over `context.UbatchContext`, which
the replay builds once a ubatch; `finding.py` is the record they raise, `values.py`
what value evidence says about racing entries, `expect.py` a trace's `expect` ops."""
