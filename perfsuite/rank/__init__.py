"""Everything inside a torchrun worker: the agent and the rank's runtime (``worker/``), one module per
engine (``strategies/``), the model builders (``models/``) and mixed-precision/model-state accounting
(``primitives``). Imports torch; never imports the pytest side."""
