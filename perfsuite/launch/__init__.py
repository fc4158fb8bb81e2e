"""Launchers start a scenario's workers in fresh processes and report the outcome."""

from perfsuite.launch.base import Launcher, LaunchOutcome, WorkerJob

__all__ = ["LaunchOutcome", "Launcher", "WorkerJob"]
