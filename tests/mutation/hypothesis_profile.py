"""pytest plugin for the mutation run (loaded with `-p tests.mutation.hypothesis_profile`).

Makes every hypothesis test of a mutant's run reproducible: derandomized (the same
examples for every mutant and every run) and without the example database (a failure
found under one mutant is not replayed under the next). Tests that set their own
`max_examples` keep it.
"""

from hypothesis import settings

settings.register_profile("mutmut", derandomize=True, database=None, deadline=None,
                          print_blob=False)
settings.load_profile("mutmut")
