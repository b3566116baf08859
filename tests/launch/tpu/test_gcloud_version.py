"""The gcloud version check of ``mnist-launch-tpu``: a step or run whose
commands use ``--spot`` (gcloud 464 and newer) or ``queued-resources`` (467
and newer) asks ``gcloud version`` once, before anything is created, and an
older SDK ends it in one line; ``--dry_run`` needs no gcloud at all."""

from __future__ import annotations


import pytest

from tests.launch.fake_cloud import FakeCloud
from tests.launch.helpers import TPU_ARGS, run_program, fake_gcloud_env

VERSION_CALL = ["version", "--format=json"]


@pytest.fixture
def gcloud(tmp_path):
    """The fake gcloud on PATH, its cloud, and a launch of a step with it."""
    cloud = FakeCloud(tmp_path / "cloud")

    def launch(step, *flags, version="548.0.0"):
        env = fake_gcloud_env(tmp_path, cloud.root, FAKE_GCLOUD_VERSION=version)
        env.pop("STORAGE_EMULATOR_HOST", None)
        return run_program("launch.tpu", step, *TPU_ARGS, *flags, "--python=false",
                          f"--dist_dir={tmp_path / 'dist'}", "--retry_seconds=5", env=env)
    return launch, cloud


@pytest.mark.parametrize("step, flags, version, needed", [
    ("create", ["--spot"], "463.0.0", "--spot needs Google Cloud SDK 464.0.0"),
    ("create", ["--queued"], "466.0.0", "--queued needs Google Cloud SDK 467.0.0"),
    ("all", ["--spot", "--delete_after"], "463.2.1", "--spot needs Google Cloud SDK 464.0.0"),
    ("run", ["--spot"], "463.0.0", "--spot needs Google Cloud SDK 464.0.0"),
    ("run", ["--spot", "--queued"], "466.0.0", "--queued needs Google Cloud SDK 467.0.0"),
])
def test_a_gcloud_too_old_for_the_flags_given_is_refused_before_anything_is_made(
        gcloud, step, flags, version, needed):
    launch, cloud = gcloud
    proc = launch(step, *flags, version=version)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"error: gcloud {version} is too old: {needed} or newer "
                           "(`gcloud components update`)\n")
    assert [c["argv"] for c in cloud.calls()] == [VERSION_CALL]
    assert cloud.vms() == {} and not list((cloud.root / "queued").iterdir())


@pytest.mark.parametrize("flags, version", [(["--spot"], "464.0.0"),
                                            (["--queued", "--spot"], "467.0.0")])
def test_the_first_gcloud_with_what_the_flags_need_creates(gcloud, flags, version):
    launch, cloud = gcloud
    proc = launch("create", *flags, version=version)
    assert proc.returncode == 0, proc.stderr
    argvs = [c["argv"] for c in cloud.calls()]
    assert argvs[0] == VERSION_CALL and argvs[1][3] == "create" and len(argvs) == 2


def test_a_step_without_spot_or_queued_does_not_ask_the_version(gcloud):
    launch, cloud = gcloud
    proc = launch("create", version="400.0.0")
    assert proc.returncode == 0, proc.stderr
    assert [c["argv"][3] for c in cloud.calls()] == ["create"]


def test_dry_run_needs_no_gcloud(tmp_path):
    proc = run_program("launch.tpu", "run", *TPU_ARGS, "--spot", "--queued",
                      f"--gcloud={tmp_path / 'no-gcloud'}", "--dry_run")
    assert proc.returncode == 0, proc.stderr
    assert "queued-resources create" in proc.stdout
