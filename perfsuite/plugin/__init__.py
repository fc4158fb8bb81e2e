"""pytest's side: the hooks and the ``perf`` fixture (``hooks``, the pytest11 entry point), hook specs,
options, this run's machine, guards, the default extra metrics, tiers, the exit status of an unjudged run,
and the run modes (``modes/``, with the largest-batch search). Torch-free."""
