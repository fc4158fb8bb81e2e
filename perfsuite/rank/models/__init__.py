"""The model builders a rank runs: transformers models, perfsuite's plain-torch GPT, a team's own module
(``module.Recipe``), and where each engine has its model built (``materialise``). Imports torch."""
