"""Worker side: runs inside each rank that torchrun starts (``python -m perfsuite.worker``).

Only this package (and ``perfsuite.strategies``) imports torch; the pytest
process never does.
"""
