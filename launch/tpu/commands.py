"""What the TPU VM launcher runs: gcloud commands and the host shell scripts.

`launch.tpu.cli` reads the settings and runs the steps; this module turns
a resolved ``TpuConfig`` into the argv lists of each step and the shell
scripts those ``gcloud compute tpus tpu-vm ssh`` commands carry to the hosts
(install, start the trainer detached, report its state, show its log);
`launch.tpu.states` reads the state lines the status script prints back.
Nothing here runs a command, so tests check the exact text and ``--dry_run``
prints it.
"""

from __future__ import annotations

import re
import secrets
import shlex
from pathlib import Path
from typing import Mapping, Sequence

from launch import errors as le
from launch import processes as lp
from launch import wheel as lw
from launch import staging
from launch.tpu.config import DEFAULT_LIBTPU, DEFAULT_TENSORFLOW, TpuConfig
from mnist_common.storage_lock import DEAD_HOSTS_ENV
from mnist_contract import MANIFEST_FILE, join_path

TRAINER_PRESET = "--preset=tpu"
# On every host, relative to the login user's home.
REMOTE_DIR = "~/mnist-tpu"
STATUS_PREFIX = "mnist-train:"
# The mark a launcher puts on what it creates: a label whose value is the
# run's id. GCE label values: lowercase letters, digits, - and _, at most 63.
MARK_KEY = "mnist-run"
RUN_ID_RE = re.compile(r"[a-z0-9_-]{1,63}")
# TPU VM names, as GCE accepts them.
VM_NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
# Shown by ``run --dry_run`` where the run's id goes (its journal's, else new).
RUN_ID_PLACEHOLDER = "RUN_ID"
PREINSTALLED = "preinstalled"
# Installed with its dependencies (the project wheel goes in with --no-deps).
GCS_DISTRIBUTION = "google-cloud-storage"
LIBTPU_FIND_LINKS = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
# Where the install check leaves the import's full output on each host.
CHECK_LOG = f"{REMOTE_DIR}/install-check.log"
# Remote shell fragments. They use double quotes only, so that the one level
# of single quotes shlex adds around ``--command=...`` stays readable.
# TPU_LOAD_LIBRARY=0: reading the version must not load libtpu, which aborts
# the process when it does not match (the check below reports that).
_TF_VERSION = ('TF_VERSION="$(TPU_LOAD_LIBRARY=0 python3 -c '
               '"import tensorflow as tf; print(tf.__version__)")"')
_IMPORT = ('python3 -c "import tensorflow as tf, tf_keras, google.cloud.storage, trainer; '
           'print(tf.__version__, tf_keras.__version__)"')
_LIBTPU_VERSION = ('LIBTPU_VERSION="$(python3 -m pip show libtpu 2>/dev/null'
                   ' | sed -n "s/^Version: //p")"')
# The symbol a mismatched libtpu lacks, from TensorFlow's fatal log line
# ``F ...tpu_executor_init_fns.inc:128] NAME not available in this library.``
_MISSING = ('MISSING="$(sed -n "s/.*\\] \\([A-Za-z0-9_]*\\) not available '
            f'in this library.*/\\1/p" {CHECK_LOG} | head -n 1)"')


def new_run_id() -> str:
    """A fresh run id, a valid label value (`RUN_ID_RE`)."""
    return secrets.token_hex(8)


def _labels(cfg: TpuConfig) -> str:
    return f"--labels={MARK_KEY}={cfg.run_id or RUN_ID_PLACEHOLDER}"


def _gcloud(cfg: TpuConfig, verb: str, *rest: str, group: str = "tpu-vm") -> lp.Command:
    """``gcloud compute tpus GROUP VERB ...`` in the run's zone and project."""
    cmd = [cfg.gcloud, "compute", "tpus", group, verb, *rest, f"--zone={cfg.zone}"]
    if cfg.project:
        cmd.append(f"--project={cfg.project}")
    return cmd


def wheel_name(pyproject: Mapping) -> str:
    return lw.wheel_filename(*lw.project_name_version(pyproject))


def create_commands(cfg: TpuConfig) -> list[lp.Command]:
    if cfg.queued:
        return queued_create_commands(cfg)
    cmd = _gcloud(cfg, "create", cfg.name)
    cmd += [f"--accelerator-type={cfg.accelerator_type}",
            f"--version={cfg.runtime_version}", _labels(cfg)]
    if cfg.spot:
        cmd.append("--spot")
    return [cmd]


def libtpu_requirement(cfg: TpuConfig) -> str | None:
    """``--libtpu``, else the pin that matches the default TensorFlow.

    A TensorFlow chosen with ``--tensorflow`` (or preinstalled) keeps the
    libtpu it resolves or ships with unless ``--libtpu`` is given.
    """
    if cfg.libtpu:
        return cfg.libtpu
    return DEFAULT_LIBTPU if cfg.tensorflow == DEFAULT_TENSORFLOW else None


def _pip_install_tensorflow(cfg: TpuConfig) -> list[str]:
    """The ``pip install`` of TensorFlow and libtpu, if there is one.

    The default pair comes from PyPI alone. Another TPU build may depend on
    a libtpu that only TensorFlow's libtpu index serves, so that index is
    passed as ``--find-links`` for a TensorFlow given with ``--tensorflow``.
    """
    packages = [] if cfg.tensorflow == PREINSTALLED else [cfg.tensorflow]
    libtpu = libtpu_requirement(cfg)
    if libtpu:
        packages.append(libtpu)
    if not packages:
        return []
    pip = ["python3", "-m", "pip", "install", "--user", *packages]
    if cfg.tensorflow not in (PREINSTALLED, DEFAULT_TENSORFLOW):
        pip += ["-f", LIBTPU_FIND_LINKS]
    return [shlex.join(pip)]


def _pip_install_gcs(pyproject: Mapping) -> str:
    """The ``pip install`` of google-cloud-storage (the trainer's gs:// lock),
    with its dependencies, in the range the trainer extra gives it."""
    wanted = [r for r in lw.extra_requirements(pyproject, "trainer")
              if lw.requirement_name(r) == GCS_DISTRIBUTION]
    if len(wanted) != 1:
        raise le.ConfigError(f"pyproject.toml: the trainer extra must list "
                             f"{GCS_DISTRIBUTION} once, not {len(wanted)} times")
    return f'python3 -m pip install --user "{wanted[0]}"'


def _check_import(cfg: TpuConfig) -> str:
    """Import TensorFlow with libtpu, tf-keras, google-cloud-storage and the
    trainer; one line if not.

    A libtpu that does not match TensorFlow aborts the process from C++
    (``F ... NAME not available in this library``, exit 134) while
    ``import tensorflow`` loads it. The import's output goes to
    ``CHECK_LOG``; on failure the host prints one ``error:`` line naming
    the libtpu, the TensorFlow and the missing symbol, and the script
    exits 1.
    """
    fix = (f"pass --libtpu={DEFAULT_LIBTPU}, the libtpu that loads with it"
           if cfg.tensorflow == DEFAULT_TENSORFLOW
           else "pass --libtpu=libtpu==X with a libtpu that matches it")
    mismatch = (f'echo "error: $(hostname): libtpu ${{LIBTPU_VERSION:-?}} '
                'does not load with TensorFlow $TF_VERSION ($MISSING not '
                f'available in this library); {fix}" >&2')
    other = (f'echo "error: $(hostname): the import check failed: '
             f'$(tail -n 1 {CHECK_LOG}) (full output in {CHECK_LOG})" >&2')
    # In braces, so bash's own "Aborted" notice goes to the log as well.
    return (f"mkdir -p {REMOTE_DIR}; if ! {{ {_IMPORT}; }} 2> {CHECK_LOG}; then "
            f"{_LIBTPU_VERSION}; {_MISSING}; "
            f'if [ -n "$MISSING" ]; then {mismatch}; else {other}; fi; '
            "exit 1; fi")


def install_script(cfg: TpuConfig, pyproject: Mapping) -> str:
    """The shell command every host runs to install TensorFlow + project.

    TensorFlow and libtpu: tensorflow-tpu 2.20.0 accepts any libtpu~=0.0.14,
    and pip picks the newest, which aborts ``import tensorflow``; only the
    full import tells which libtpu loads, and 0.0.31 is the newest that does
    (``DEFAULT_LIBTPU``; the versions tried are in docs/tpu_vm_stack.md).
    Both come from PyPI, so TensorFlow's libtpu index is not needed for
    them. The last step imports everything and turns a mismatch into one
    ``error:`` line (`_check_import`).

    tf-keras declares a dependency on the ``tensorflow`` distribution, which
    a TPU build (``tensorflow-tpu``) does not provide; installing it with its
    dependencies would add the CPU-only ``tensorflow`` wheel on top of the
    same import package. Hence ``--no-deps`` for tf-keras (pinned to the
    installed TensorFlow's minor version) and for this project's wheel.
    google-cloud-storage, which the trainer extra lists for the gs:// lock
    and TensorFlow does not bring, goes in after TensorFlow with its
    dependencies, so pip resolves them beside the TensorFlow installed.
    """
    steps = ["set -e", "cd ~", *_pip_install_tensorflow(cfg), _pip_install_gcs(pyproject),
             _TF_VERSION]
    steps.append('python3 -m pip install --user --no-deps '
                 '"tf-keras~=${TF_VERSION%.*}.0"')
    steps.append(shlex.join(["python3", "-m", "pip", "install", "--user",
                             "--no-deps", "--force-reinstall",
                             wheel_name(pyproject)]))
    steps.append(_check_import(cfg))
    return "; ".join(steps)


def build_commands(cfg: TpuConfig) -> list[lp.Command]:
    """``pip wheel`` of a checkout; none for an installed copy (`launch.staging`)."""
    return staging.build_commands(cfg.wheel_source, cfg.python, cfg.dist_dir,
                                  cfg.build_isolation)


def setup_commands(cfg: TpuConfig, pyproject: Mapping) -> list[lp.Command]:
    """The wheel's build (`build_commands`), its copy to every host, the install."""
    wheel = cfg.dist_dir / wheel_name(pyproject)
    return [
        *build_commands(cfg),
        _gcloud(cfg, "scp", str(wheel), f"{cfg.name}:", "--worker=all"),
        _gcloud(cfg, "ssh", cfg.name, "--worker=all",
                f"--command={install_script(cfg, pyproject)}"),
    ]


def trainer_command(cfg: TpuConfig) -> list[str]:
    """``python3 -m trainer`` with the TPU preset unless one is given."""
    tpu = cfg.name if cfg.multi_host else "local"
    own_preset = any(a == "--preset" or a.startswith("--preset=")
                     for a in cfg.trainer_args)
    preset = [] if own_preset else [TRAINER_PRESET]
    return ["python3", "-m", "trainer", *preset, "--strategy=tpu",
            f"--tpu={tpu}", f"--data={cfg.data}",
            f"--model_dir={cfg.model_dir}", *cfg.trainer_args]


def check_trainer_args(cfg: TpuConfig) -> None:
    """The trainer's own answer to the command the hosts will run, asked here
    before a TPU VM is created: a misspelled flag or a value the trainer
    refuses would otherwise end the run only once the VM is up and set up.
    `trainer.config` loads no TensorFlow (the standard library is enough)."""
    from trainer.config import flag_problem
    problem = flag_problem(trainer_command(cfg)[3:], on_tpu=True)
    if problem:
        raise le.ConfigError(f"trainer arguments: {problem}")


def train_script(cfg: TpuConfig, dead_hosts: Sequence[str] = ()) -> str:
    """Start the trainer in the background on a host and return.

    The trainer runs in a subshell that ignores SIGHUP (what ``nohup``
    does), reads /dev/null and writes ``train.log``, so neither the end of
    this ssh session nor a dropped connection reaches it. The subshell
    outlives a SIGTERM to every process (a preemption notice) by trapping
    it, so it still records the status of the trainer, which saves and
    exits 143 (a trap, unlike an ignored signal, is not inherited). The subshell's
    pid goes to ``train.pid`` before this script returns; when the trainer
    ends, the subshell writes its status to ``train.exit`` (renamed into
    place, so a reader never sees it half written). A host where a trainer
    is still running refuses to start a second one. ``dead_hosts``: hosts of
    deleted VMs, whose hold on the model_dir lock the trainer takes over at
    once (`mnist_common.storage_lock.DEAD_HOSTS_ENV`).
    """
    prefix = "TPU_LOAD_LIBRARY=0 " if cfg.multi_host else ""
    if dead_hosts:
        prefix += f"{DEAD_HOSTS_ENV}={shlex.quote(','.join(sorted(dead_hosts)))} "
    return "; ".join([
        f"mkdir -p {REMOTE_DIR}",
        f"cd {REMOTE_DIR} || exit 1",
        'if [ -f train.pid ] && [ ! -f train.exit ] && '
        'kill -0 "$(cat train.pid)" 2>/dev/null; then '
        'echo "error: $(hostname): a trainer is already running, pid '
        '$(cat train.pid); see the logs step" >&2; exit 1; fi',
        "rm -f train.pid train.exit train.exit.tmp",
        "if [ -f train.log ]; then mv train.log train.log.prev; fi",
        '( trap "" HUP; trap : TERM; ' + prefix + shlex.join(trainer_command(cfg))
        + '; echo $? > train.exit.tmp && mv train.exit.tmp train.exit )'
        " < /dev/null > train.log 2>&1 & echo $! > train.pid",
        'echo "trainer started on $(hostname), pid $(cat train.pid), log '
        f'{REMOTE_DIR}/train.log"',
    ])


def status_script() -> str:
    """One ``mnist-train: STATE [step=S/T] [resumed=N] on HOST`` line from a host.

    ``train.exit`` is read first: the subshell is alive until just after
    it writes that file, so there is no moment with neither. The step is
    the last ``step S/T`` the trainer printed (its progress lines, the
    resume and the stop lines), ``resumed`` the step it resumed from.
    """
    line = f'echo "{STATUS_PREFIX} '
    progress = "$P$R on $(hostname)\""
    return "; ".join([
        f"if ! cd {REMOTE_DIR} 2>/dev/null || [ ! -f train.pid ]; then "
        f'{line}not started on $(hostname)"',
        'else P="$(sed -n "s|.*step \\([0-9][0-9]*/[0-9][0-9]*\\).*| step=\\1|p" '
        'train.log 2>/dev/null | tail -n 1)"',
        'R="$(sed -n "s|^resuming at step \\([0-9][0-9]*\\)/.*| resumed=\\1|p" '
        'train.log 2>/dev/null | head -n 1)"',
        f'if [ -f train.exit ]; then {line}exited status=$(cat train.exit){progress}',
        'elif kill -0 "$(cat train.pid)" 2>/dev/null; then '
        f'{line}running pid=$(cat train.pid){progress}',
        f'else {line}stopped without an exit status (killed, or the host '
        'restarted) on $(hostname)"; fi; fi',
    ])


def logs_script(cfg: TpuConfig) -> str:
    """The end of a host's log; following it stops when the trainer ends."""
    tail = f"tail -n {cfg.lines}"
    if cfg.follow:
        show = ('if [ -f train.pid ] && [ ! -f train.exit ]; then '
                f'{tail} -F --pid="$(cat train.pid)" train.log; '
                f'else {tail} train.log; fi')
    else:
        show = f"{tail} train.log"
    return (f"if cd {REMOTE_DIR} 2>/dev/null && [ -f train.log ]; then "
            f"{show}; else echo \"$(hostname): no {REMOTE_DIR}/train.log\" "
            ">&2; fi")


def _train_worker(cfg: TpuConfig) -> str:
    # One host: the same program on every worker (there is only worker 0).
    # Several hosts: TensorFlow's single client on worker 0 drives the slice.
    return "--worker=0" if cfg.multi_host else "--worker=all"


def manifest_command(cfg: TpuConfig) -> lp.Command:
    """Prints the dataset's manifest.json here, with the user's own gcloud
    and credentials (the launcher needs no Cloud Storage library)."""
    cmd = [cfg.gcloud, "storage", "cat", join_path(cfg.data, MANIFEST_FILE)]
    if cfg.project:
        cmd.append(f"--project={cfg.project}")
    return cmd


def train_commands(cfg: TpuConfig, dead_hosts: Sequence[str] = ()) -> list[lp.Command]:
    """The manifest read (to compare the train files with the slice's
    hosts), then the start of the trainer."""
    return [manifest_command(cfg),
            _gcloud(cfg, "ssh", cfg.name, _train_worker(cfg),
                    f"--command={train_script(cfg, dead_hosts)}")]


def status_commands(cfg: TpuConfig) -> list[lp.Command]:
    # Every worker: hosts that run no trainer answer "not started".
    return [_gcloud(cfg, "ssh", cfg.name, "--worker=all",
                    f"--command={status_script()}")]


def logs_commands(cfg: TpuConfig) -> list[lp.Command]:
    return [_gcloud(cfg, "ssh", cfg.name, "--worker=all",
                    f"--command={logs_script(cfg)}")]


def delete_commands(cfg: TpuConfig) -> list[lp.Command]:
    if cfg.queued:  # --force: the node goes with its queued resource
        return [_queued(cfg, "delete", cfg.name, "--force", "--quiet")]
    return [_gcloud(cfg, "delete", cfg.name, "--quiet")]


def _queued(cfg: TpuConfig, verb: str, *rest: str) -> lp.Command:
    return _gcloud(cfg, verb, *rest, group="queued-resources")


def queued_create_commands(cfg: TpuConfig) -> list[lp.Command]:
    """A queued resource named as the VM: Cloud TPU creates the VM when
    capacity is free instead of refusing the request."""
    cmd = _queued(cfg, "create", cfg.name, f"--node-id={cfg.name}",
                  f"--accelerator-type={cfg.accelerator_type}",
                  f"--runtime-version={cfg.runtime_version}", _labels(cfg))
    if cfg.spot:
        cmd.append("--spot")
    return [cmd]


def describe_command(cfg: TpuConfig) -> lp.Command:
    """Prints the VM as JSON: its ``state`` (READY, CREATING, PREEMPTED,
    ...) and ``labels``; exits 1 with NOT_FOUND when there is no VM of
    that name."""
    return _gcloud(cfg, "describe", cfg.name, "--format=json")


def describe_commands(cfg: TpuConfig) -> list[lp.Command]:
    """What ``run`` asks before each decision: the queued resource's state
    and, once it is ACTIVE, its VM's; else the VM's."""
    if cfg.queued:
        return [queued_describe_command(cfg), describe_command(cfg)]
    return [describe_command(cfg)]


def queued_describe_command(cfg: TpuConfig) -> lp.Command:
    """Prints the queued resource as JSON: its ``state.state`` (ACCEPTED,
    PROVISIONING, ACTIVE, SUSPENDED, FAILED, ...) and, under
    ``tpu.nodeSpec[].node.labels``, the labels its VM is made with."""
    return _queued(cfg, "describe", cfg.name, "--format=json")


def fetch_log_command(cfg: TpuConfig, dest: Path) -> lp.Command:
    """Copies the trainer host's log here (worker 0: the one that trains)."""
    return _gcloud(cfg, "scp", f"{cfg.name}:{REMOTE_DIR}/train.log", str(dest),
                   "--worker=0")


# The steps that reach an existing VM: each runs after a describe that
# found the VM carrying this launch's mark (`launch.tpu.cloud.Cloud`).
REACHES_VM = ("setup", "train", "wait", "status", "logs", "delete")


def phases(step: str, cfg: TpuConfig,
           pyproject: Mapping) -> list[tuple[str, list[lp.Command]]]:
    """The steps ``step`` runs, in order, each with its commands.

    The one source of what runs: ``execute`` runs these commands and
    ``--dry_run`` prints them.
    """
    builders = {
        "create": lambda: create_commands(cfg),
        "setup": lambda: setup_commands(cfg, pyproject),
        "train": lambda: train_commands(cfg),
        "wait": lambda: status_commands(cfg),
        "status": lambda: status_commands(cfg),
        "logs": lambda: logs_commands(cfg),
        "delete": lambda: delete_commands(cfg),
        "describe": lambda: describe_commands(cfg),
    }
    names = [step]
    if step == "all":
        names = ["create", "setup", "train", "wait"] + (
            ["delete"] if cfg.delete_after else [])
    elif step == "run":  # without a preemption; launch/tpu/spot/runner.py has the loop
        names = ["describe", "create", "setup", "train", "wait", "delete", "describe"]
    if step != "run":  # each step that reaches the VM checks its mark first
        names = [n for name in names
                 for n in (["describe", name] if name in REACHES_VM else [name])]
    return [(name, builders[name]()) for name in names]


def plan(step: str, cfg: TpuConfig, pyproject: Mapping) -> list[lp.Command]:
    """Every command ``step`` runs, in order (``wait`` repeats its one)."""
    return [cmd for _, cmds in phases(step, cfg, pyproject) for cmd in cmds]


