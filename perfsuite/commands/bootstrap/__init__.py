"""``python -m perfsuite bootstrap``: from a bare runner to a gate that judges, in one bounded command.

It drives pytest runs of the suite from outside (it is not a pytest mode) and
makes this runner's profile ready to judge, most informative work first,
inside a wall-clock budget:

1. ``doctor``: fingerprint, profile, engines that import, NVML at idle;
2. ``ceilings``: best-shape matmul per dtype, device copy and (2+ GPUs) NCCL
   all-reduce bus bandwidth, each against the SKU's datasheet;
3. ``baseline``: every scenario that fits here, one per test group before a
   second of any group;
4. ``cv``: the spread between fresh launches, calibrated into tolerances;
5. ``selftest``: the gate's detection of planted 3/5/10% slowdowns and its
   false alarms at 0%;
6. ``report``: markdown, results JSON and the HTML report.

Modules: :mod:`.plan` (what runs, in which order; pure), :mod:`.costs` (the
estimates table the budget is judged by), :mod:`.state` (what is done, on
disk after every step), :mod:`.steps` (how each kind of step runs),
:mod:`.probe` (NVML at idle), :mod:`.report` and :mod:`.run` (the loop).
Pytest side: nothing here imports torch.
"""
