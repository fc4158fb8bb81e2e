"""``python -m perfsuite`` subcommands beyond the pytest run: doctor, profile (``collection``), bootstrap,
calibrate --pool, explain, ab-rev, history, report and summary, init. Torch-free."""
