"""pytest configuration of the example team repository: at its root, so ``teampkg`` is importable
by the pytest process and by the ranks perfsuite launches."""
