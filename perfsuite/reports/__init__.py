"""What a run leaves behind: the terminal summary and the results file, cost and job estimates, the HTML
page (``html/``), and the exporters (``exports/``: pytest-benchmark JSON, history, GitHub annotations).
Torch-free."""
