"""One scenario's life on the pytest side: the run's settings, fitting a scenario to this machine, its
launches, the session that resolves, launches, judges, confirms and records, writing a baseline, and the
profiled launches. Torch-free."""
