"""What is kept between runs: baseline files, stored op profiles, the quarantine list, and the git commit
a run measured. Torch-free."""
