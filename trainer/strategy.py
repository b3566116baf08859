"""Choosing a tf.distribute strategy: TPU, GPUs, several workers, or CPU replicas.

The TPU branch follows the TF "Use TPUs" guide: resolve the TPU
(``'local'`` on a TPU VM, its name from elsewhere), connect to it, initialize
the TPU system, and wrap it in `TPUStrategy`. Off a TPU, TensorFlow answers
with one of several exceptions (a missing kernel, a failed name lookup, a
``ValueError``) buried in internals; we turn each into one `TrainerError`
line.

``cpu_replicas=N`` splits the one physical CPU into N logical devices and
mirrors over them, so the multi-replica code paths (per-replica batches,
cross-replica reductions, input pipelines per replica) run on a laptop and in
tests. TensorFlow fixes its device list the first time it touches the
runtime; after that the split cannot be changed, so a process that needs
replicas must ask for them before doing anything else with TensorFlow (tests
run such cases in a fresh subprocess).

The run asks its strategy everything once, when it is made: `Distribution`
holds the answers (its public name, replicas, hosts, whether it spans
workers, whether this task is the chief, whether XLA runs under it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Optional, Sequence

import tensorflow as tf

from trainer import _compat, cluster
from trainer.errors import TrainerError, summarize_error

log = logging.getLogger(__name__)

# Device files present on Cloud TPU VMs (v2/v3 expose /dev/accel*, v4 and
# later go through VFIO). Used only as a hint by strategy=auto.
_TPU_DEVICE_HINTS = ("/dev/accel0", "/dev/vfio/0")


def split_cpu(num_replicas: int) -> list[str]:
    """Makes the CPU appear as ``num_replicas`` logical devices; returns their names.

    Idempotent: asking again for the split already in place is fine.
    """
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is None or len(current) != num_replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpus[0],
                [tf.config.LogicalDeviceConfiguration()] * num_replicas)
        except RuntimeError:
            have = len(tf.config.list_logical_devices("CPU"))
            if have != num_replicas:
                raise TrainerError(
                    f"cannot split the CPU into {num_replicas} replicas: "
                    f"TensorFlow already initialized {have} CPU device(s) in this "
                    "process; ask for replicas before any other TensorFlow work"
                ) from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


_tpu_connections: dict[str, "tf.distribute.TPUStrategy | TrainerError"] = {}


def tpu_strategy(tpu: Optional[str]) -> tf.distribute.TPUStrategy:
    """Connects to a TPU (``'local'`` on a TPU VM) and returns a TPUStrategy.

    Once per TPU name and process, success or failure: initializing the TPU
    system again would discard what it holds, and choosing the preset
    (`resolves_to_tpu`) asks before the run makes its strategy.
    """
    name = tpu or os.environ.get("TPU_NAME") or "local"
    if name not in _tpu_connections:
        _tpu_connections[name] = _connect_tpu(name)
    found = _tpu_connections[name]
    if isinstance(found, TrainerError):
        raise found
    return found


def _connect_tpu(name: str) -> "tf.distribute.TPUStrategy | TrainerError":
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, OSError, tf.errors.OpError) as e:
        # OSError covers urllib's URLError when a TPU name cannot be resolved.
        return TrainerError(
            f"--tpu={name}: no TPU found ({type(e).__name__}: {summarize_error(e)}); "
            "on a Cloud TPU VM use --tpu=local, elsewhere the TPU's name, "
            "or --strategy=auto to run without one")
    log.info("TPU %s: %d cores", name, strategy.num_replicas_in_sync)
    return strategy


def tpu_hinted(tpu: Optional[str]) -> bool:
    return bool(tpu or os.environ.get("TPU_NAME")
                or any(os.path.exists(p) for p in _TPU_DEVICE_HINTS))


_mirrored: dict[Optional[tuple[str, ...]], tf.distribute.MirroredStrategy] = {}


def mirrored(devices: Optional[Sequence[str]] = None) -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy per device set and process, made on first use.

    A second MirroredStrategy over the same devices restarts the collective
    instance keys, and the runtime, which keeps the first one's collective
    ops, then rejects another model's shapes ("Shape mismatch in the
    collective instance 100"): a second training in the same process (a
    notebook, a test) must reuse the strategy.
    """
    key = tuple(devices) if devices else None
    if key not in _mirrored:
        _mirrored[key] = tf.distribute.MirroredStrategy(devices=devices)
    return _mirrored[key]


def make_strategy(kind: str = "auto", tpu: Optional[str] = None,
                  cpu_replicas: int = 0, cluster_timeout: float = 180.0
                  ) -> tf.distribute.Strategy:
    """Returns the strategy for ``kind`` (see `trainer.config.STRATEGIES`).

    ``auto``: a TPU when there are signs of one (``--tpu``, ``TPU_NAME``, TPU
    device files), else all GPUs (Mirrored), else several workers when
    ``TF_CONFIG`` is set, else the default (single-device) strategy.
    ``cpu_replicas > 0`` mirrors over that many logical CPU devices instead
    (`trainer.config.TrainConfig` accepts it only with auto or mirrored).
    A ``TF_CONFIG`` cluster must start within ``cluster_timeout`` seconds
    (`trainer.cluster.start`).
    """
    if cpu_replicas:
        devices = split_cpu(cpu_replicas)
        log.info("MirroredStrategy over %d logical CPU devices", len(devices))
        return mirrored(devices)
    if kind == "auto":
        found = _auto_tpu(tpu)
        if found is not None:
            return found
        kind = ("mirrored" if tf.config.list_physical_devices("GPU")
                else "multi_worker" if os.environ.get("TF_CONFIG") else "default")
    if kind == "tpu":
        return tpu_strategy(tpu)
    if kind == "mirrored":
        return mirrored()
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind != "multi_worker":
        raise TrainerError(f"unknown strategy {kind!r}")
    return cluster.start(os.environ.get("TF_CONFIG", ""), cluster_timeout)


def xla_missing(strategy: tf.distribute.Strategy) -> str:
    """Why ``--jit_compile`` cannot run under ``strategy`` ("" where it can):
    off a TPU it needs XLA for the local devices.

    The TPU build of TensorFlow (tensorflow-tpu) carries no XLA CPU
    backend, so off a TPU every compiled step would fail inside Keras with
    ``could not find registered transfer manager for platform Host``. A
    one-op compiled function finds that out first (about 0.1 s).
    """
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return ""
    device = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    try:
        tf.function(lambda: tf.constant(1.0) + 1.0, jit_compile=True)()
    except tf.errors.OpError as e:
        return (f"--jit_compile=true off a TPU: this TensorFlow build has no XLA "
                f"{device} backend ({summarize_error(e)}); drop --jit_compile or "
                "run on a TPU")
    return ""


def _auto_tpu(tpu: Optional[str]) -> Optional[tf.distribute.TPUStrategy]:
    """strategy=auto's TPU: when there are signs of one and it answers."""
    if not tpu_hinted(tpu):
        return None
    try:
        return tpu_strategy(tpu)
    except TrainerError as e:
        if tpu:  # asked for by name: do not silently fall back
            raise
        log.warning("strategy=auto: %s; trying GPUs/CPU", e)
        return None


def resolves_to_tpu(kind: str = "auto", tpu: Optional[str] = None,
                    cpu_replicas: int = 0) -> bool:
    """Whether `make_strategy` with these arguments gives a TPUStrategy.

    Touches TensorFlow's runtime only where a TPU is asked for or hinted:
    then it connects (`tpu_strategy`, whose connection the run reuses), and
    an unreachable ``--strategy=tpu`` or named ``--tpu`` fails here.
    """
    if cpu_replicas:
        return False
    if kind == "tpu":
        return tpu_strategy(tpu) is not None
    return kind == "auto" and _auto_tpu(tpu) is not None


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """Whether training spans several worker processes (collectives between them)."""
    return _compat.in_multi_worker_mode(strategy)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this task writes checkpoints and summaries (multi-worker aware).

    Single-worker strategies always are. Under multi-worker training the
    chief is task ``chief`` or, without one, ``worker`` 0.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not is_multi_worker(strategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None or task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and not has_chief


def sum_over_replicas(strategy: tf.distribute.Strategy
                      ) -> Optional[Callable[[Sequence[float]], list[float]]]:
    """A function giving the sums over all replicas (of all workers) of the
    numbers each worker passes, or None off multi-worker training.

    It is a collective: every worker calls it at the same point of the run
    or all of them wait. Workers agree through it on what one of them alone
    knows (a stop signal, the checkpoint it restored). An all-reduce: the
    cheapest collective, it runs at every call boundary (docs/trainer.md).
    """
    if not is_multi_worker(strategy):
        return None

    @tf.function
    def total(values):
        per_replica = strategy.run(tf.identity, args=(values,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def sums(values: Sequence[float]) -> list[float]:
        return total(tf.constant(list(values), tf.float64)).numpy().tolist()
    return sums


def public_name(strategy: tf.distribute.Strategy) -> str:
    """The strategy's public TF name (``default`` for the no-op strategy).

    Instances are of private classes (``CollectiveAllReduceStrategy``,
    ``_DefaultDistributionStrategy``), so the name comes from the public
    class they are an instance of.
    """
    for cls, name in ((tf.distribute.TPUStrategy, "TPUStrategy"),
                      (tf.distribute.MultiWorkerMirroredStrategy,
                       "MultiWorkerMirroredStrategy"),
                      (tf.distribute.MirroredStrategy, "MirroredStrategy")):
        if isinstance(strategy, cls):
            return name
    return "default" if _compat.is_default_strategy(strategy) else type(strategy).__name__


def num_hosts(strategy: tf.distribute.Strategy) -> int:
    """Hosts (workers, TPU hosts) the global batch is read on: one input pipeline each."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return int(strategy.extended.num_hosts)
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None and is_multi_worker(strategy):
        spec = resolver.cluster_spec().as_dict()
        return len(spec.get("worker", [])) + len(spec.get("chief", []))
    return 1


@dataclasses.dataclass(frozen=True)
class Distribution:
    """The run's strategy and every answer the run needs from it, asked once
    (`Distribution.of`): the parts read these instead of asking again."""

    strategy: tf.distribute.Strategy
    name: str  # `public_name`
    replicas: int
    hosts: int  # `num_hosts`: one input pipeline each
    multi_worker: bool  # `is_multi_worker`
    chief: bool  # `is_chief`
    tpu: bool
    share: Optional[Callable[[Sequence[float]], list[float]]]  # `sum_over_replicas`
    no_xla: str  # `xla_missing` where --jit_compile is asked for, else ""

    @classmethod
    def of(cls, strategy: tf.distribute.Strategy, *, jit_compile: bool = False
           ) -> "Distribution":
        """Asks ``strategy`` each question once, just after it is made. XLA is
        tried only where ``--jit_compile`` asks for it; its refusal is raised
        later, in its turn among the checks (`trainer.run.plan.plan_run`)."""
        return cls(strategy=strategy, name=public_name(strategy),
                   replicas=strategy.num_replicas_in_sync, hosts=num_hosts(strategy),
                   multi_worker=is_multi_worker(strategy), chief=is_chief(strategy),
                   tpu=isinstance(strategy, tf.distribute.TPUStrategy),
                   share=sum_over_replicas(strategy),
                   no_xla=xla_missing(strategy) if jit_compile else "")

    def describe(self) -> str:
        return f"{self.name} with {self.replicas} replica(s)"
