"""What a measurement says: aggregation and statistics, verdicts and significance, whether it can be
judged at all and the tolerances its spread supports, definitions and contention, same-session ceilings
and MFU, coverage, the A/B's paired statistics, the op-profile explanation, and the gate's rates
computed from measured spread (``simulate/``). Torch-free."""
