"""Reading a results file (``pytest --perf-json FILE``) for people: an HTML page
and a summary table.

* :mod:`~perfsuite.reports.html.results` loads and checks the file and pulls out
  what every view shows (primary metric, delta, tolerance, seed reference);
* :mod:`~perfsuite.reports.html.summary` writes the summary as markdown (a CI job
  summary) or as rows for a plain-text table;
* :mod:`~perfsuite.reports.html.plots` draws the charts with matplotlib;
* :mod:`~perfsuite.reports.html.efficiency` tabulates cost and time per group
  and the achieved TFLOP/s against the session's ceilings and the datasheet;
* :mod:`~perfsuite.reports.html.page` assembles one self-contained HTML page
  (charts embedded as PNG data) with jinja2, optionally with trend charts from
  a history folder (:mod:`perfsuite.reports.exports.history`).

matplotlib and jinja2 are the ``report`` extra (also in ``test``): only the
page needs them, so ``summary`` works without.
"""
