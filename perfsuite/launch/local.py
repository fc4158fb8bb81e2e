"""Single-node launcher: PyTorch's elastic launcher (torchrun) on this machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid

from perfsuite.launch.base import Launcher, LaunchOutcome, WorkerJob, classify
from perfsuite.launch.procs import TOKEN_VAR, dump_worker_stacks, kill_tagged


def free_port() -> int:
    """A TCP port free right now on loopback, for this run's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalTorchrun(Launcher):
    name = "local"

    def command(self, job: WorkerJob, port: int, run_id: str) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1",
            "--nproc-per-node", str(job.world_size),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", run_id,
            "--max-restarts", "0",
            "--log-dir", str(job.logs_dir),
            "--redirects", "3",
            "-m", "perfsuite.worker", str(job.spec_path),
        ]  # fmt: skip

    def run(self, job: WorkerJob) -> LaunchOutcome:
        token = uuid.uuid4().hex
        job.reports_dir.mkdir(parents=True, exist_ok=True)
        job.spec_path.write_text(json.dumps(dict(job.spec), indent=2))
        env = {**os.environ, **job.env, TOKEN_VAR: token}
        start = time.monotonic()
        with open(job.workdir / "torchrun.log", "wb") as log:
            proc = subprocess.Popen(
                self.command(job, free_port(), token),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=job.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                dump_worker_stacks(token)
            finally:
                # Always sweep: even a clean exit may leave a daemonised helper.
                kill_tagged(token, proc.pid)
                proc.wait()
        return classify(job, timed_out, time.monotonic() - start)
