"""Several torchrun agents as the nodes of one job, on 127.0.0.1 (a test harness).

Each node is a ``torchrun --nnodes N`` agent started in a working directory of its own (its
node-local disk: nothing is shared between nodes but what the job reaches over the network), and
the agents meet through c10d rendezvous on a free port of 127.0.0.1, the first agent hosting its
store. Every rank runs ``python -m tests.node_job ...`` and writes its results into its node's
directory. The harness waits at most ``timeout`` seconds for every agent, then kills each agent
with everything it started (its ranks included), so a test never leaves a process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.dist import free_port
from tests.integration_jobs import _kill_group, job_env


def run_nodes(directories: list[Path], ranks_per_node: int, args: list[str], *, timeout: float = 240,
              env: dict[str, str] | None = None) -> list[str]:
    """``tests.node_job *args`` on ``len(directories)`` nodes of ``ranks_per_node`` ranks each, node ``n``
    started in ``directories[n]``; each agent's output. Raises ``AssertionError`` if an agent fails or
    the job outlives ``timeout``."""
    port, job = free_port(), f"nodes-{uuid.uuid4().hex[:8]}"
    agents, logs = [], []
    for node, directory in enumerate(directories):
        directory.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(directories)}",
                   f"--nproc_per_node={ranks_per_node}", "--rdzv_backend=c10d",
                   f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={job}",
                   f"--rdzv_conf=is_host={int(node == 0)},join_timeout={int(timeout)}", "--local_addr=127.0.0.1",
                   "--max_restarts=0", "--monitor_interval=0.5", "-m", "tests.node_job", *args]
        log = directory / f"agent-{job}.log"  # a file, not a pipe: an agent never blocks on its output
        logs.append(log)
        with open(log, "w") as out:
            agents.append(subprocess.Popen(command, cwd=directory, env=env or job_env(), stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    try:
        for node, agent in enumerate(agents):
            try:
                agent.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"node {node} of the job {args} did not finish within {timeout:g} s:\n"
                                     f"{logs[node].read_text()[-4000:]}") from None
            if agent.returncode != 0:
                raise AssertionError(f"node {node} of the job {args} failed with exit code {agent.returncode}:\n"
                                     f"{logs[node].read_text()[-6000:]}")
    finally:
        for agent in agents:
            _kill_group(agent.pid)  # the agent and every rank it started
            agent.wait()
    return [log.read_text() for log in logs]


def results(directories: list[Path], name: str) -> list[Any]:
    """The results ``name.rank<r>.json`` the ranks wrote into their nodes' directories, in rank order."""
    found = {int(path.stem.rsplit("rank", 1)[1]): json.loads(path.read_text())
             for directory in directories for path in directory.glob(f"{name}.rank*.json")}
    assert found and sorted(found) == list(range(len(found))), f"ranks that wrote {name}: {sorted(found)}"
    return [found[rank] for rank in sorted(found)]


def write(name: str, value: Any) -> None:
    """From a rank: ``value`` as this rank's result ``name``, in its node's directory (the working one)."""
    path = Path(os.getcwd()) / f"{name}.rank{os.environ['RANK']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)
