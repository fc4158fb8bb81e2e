"""Exporters of a session's results document, each a pytest plugin of its own.

* :mod:`perfsuite.reports.exports.benchjson`: ``--perf-benchmark-json`` and
  ``--perf-benchmark-save``, pytest-benchmark's JSON format and storage layout,
  so its ``compare`` command works on perfsuite runs;
* :mod:`perfsuite.reports.exports.history`: ``--perf-history``, one file per run per
  profile with the git commit, and the typed API that reads it back;
* :mod:`perfsuite.reports.exports.changepoint`: e-divisive means change-point
  detection over a history series;
* :mod:`perfsuite.commands.history`: ``python -m perfsuite history``.

They implement ``pytest_perfsuite_session_finished`` like any user plugin and
never import torch.
"""
