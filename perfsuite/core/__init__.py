"""What both sides share, torch-free: the scenario kinds (``workloads/``), engine specs (``engines/``),
model specs and their collection probe (``models/``), metrics, hardware profiles, relations, the rank
protocol and layout, validation, atomic files, NVML codes, the op-profile format, this host's processor
and plain-text tables. Imports neither side and no torch."""
