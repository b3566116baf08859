"""The job on a second real distributed engine: Beam's DaskRunner.

A Dask scheduler and two worker processes are started on 127.0.0.1 with
Dask's own command-line entry points, as on a cluster of one's own. The job
runs there with the runner's shuffle (``--shuffle=beam``, what Dataflow
runs) and with the file shuffle (the workers share this machine's disk), and
its output must equal DirectRunner's byte for byte.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("distributed", reason="needs the dask extra: pip install '.[dask]'")


from tests.helpers import REPO, free_port, run_job  # noqa: E402


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def dask_cluster(tmp_path):
    """tcp://127.0.0.1:PORT of a scheduler with two single-threaded worker processes."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    logs = open(tmp_path / "dask.log", "w")
    processes = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host=127.0.0.1",
         f"--port={port}", "--no-dashboard"], stdout=logs, stderr=logs, env=env)]
    try:
        for i in range(2):
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address,
                 "--host=127.0.0.1", "--nworkers=1", "--nthreads=1", "--no-dashboard",
                 f"--name=worker-{i}", f"--local-directory={tmp_path / f'w{i}'}"],
                stdout=logs, stderr=logs, env=env))
        from distributed import Client
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            pids = client.run(os.getpid)
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
        yield address
    finally:
        # Workers first, while their scheduler still answers: a worker whose
        # scheduler is already gone waits out reconnection attempts.
        workers, scheduler = processes[1:], processes[:1]
        for group in (workers, scheduler):
            for process in group:
                process.terminate()
            for process in group:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        logs.close()


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", ["beam", "files"])  # files: the workers share a disk
def test_dask_runner_writes_what_direct_runner_writes(tmp_path, idx_dir, dask_cluster, shuffle):
    flags = [f"--source={idx_dir}", "--min_shards=3", "--allow_extreme_sharding"]
    direct = run_job([*flags, f"--output={tmp_path / 'direct'}", "--runner=DirectRunner"])
    dask = run_job([*flags, f"--output={tmp_path / 'dask'}", "--runner=DaskRunner",
                    f"--dask_client_address={dask_cluster.removeprefix('tcp://')}",
                    f"--shuffle={shuffle}"])
    assert dask == direct
    got, expected = snapshot(tmp_path / "dask"), snapshot(tmp_path / "direct")
    assert sorted(got) == sorted(expected) and len(got) == 9  # 6 shards + 3 metadata
    assert got == expected
