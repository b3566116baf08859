"""Two real worker processes under MultiWorkerMirroredStrategy on localhost.

Checks what only several workers exercise:

* the input each worker reads, through the strategy's own ``InputContext``
  (``num_input_pipelines=2``, ``input_pipeline_id`` = the worker's index,
  the same path a TPU Pod takes per host): over one epoch the two workers'
  ``index`` values are disjoint and together are the whole split, both with
  4 train shards (sharded by file) and with 1 shard (too few for 2 hosts:
  sharded by record, with a warning), read from the files and held in
  memory (``--cache``: each worker decodes its own share), and the padded
  evaluation stream covers the test split exactly once between them;
* a training run with both loops: exact evaluation across workers, and only
  the chief writes checkpoints and summaries into model_dir (its log says
  so, every TensorBoard event file carries the chief's process id, and the
  other worker's scratch directory is gone).
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

import mnist_contract as contract
from tests import trainer_data
from tests.trainer import trainer_runs

pytestmark = pytest.mark.slow


def run_workers(argv_for, timeout: int = 240,
                log_level: bool = True) -> list[tuple[int, str, str, int]]:
    """Two workers (`tests.trainer.trainer_runs.start_workers`) to their end;
    ``(rc, out, err, pid)`` each."""
    return trainer_runs.finish_workers(
        trainer_runs.start_workers(argv_for, log_level=log_level), timeout)


# Each worker: the trainer's strategy and input builders, one epoch of its local
# batches; prints the InputContext it was given and the indices it read.
INSPECT = textwrap.dedent(r'''
    import json, logging, sys
    import trainer
    from trainer import strategy as strategy_lib
    from trainer.config import TrainConfig
    from trainer.data import input_pipeline, splits
    import mnist_contract as contract

    warnings = []
    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())
    logging.getLogger("trainer.data.input_pipeline").addHandler(Keep(logging.WARNING))

    strategy = strategy_lib.make_strategy("multi_worker")
    result = {"replicas": strategy.num_replicas_in_sync,
              "chief": strategy_lib.is_chief(strategy)}
    for name in sys.argv[1:]:
        files = splits.split_files(name, splits.load_manifest(name), "train")
        contexts = []
        def dataset_fn(ctx, build):
            contexts.append([ctx.num_input_pipelines, ctx.input_pipeline_id])
            return build(ctx)
        # Global batch 2 on 2 replicas: one example per step per worker, so
        # one epoch of this worker's pipeline is exactly its share of steps.
        share = input_pipeline.pipeline_example_counts(files.counts, 2)

        def one_epoch(**options):
            dist = strategy.distribute_datasets_from_function(lambda c: dataset_fn(
                c, lambda ctx: input_pipeline.train_dataset(files, 2, ctx, **options)))
            it, seen = iter(dist), []
            for _ in range(max(share)):
                for local in strategy.experimental_local_results(next(it)):
                    seen.extend(local[contract.INDEX_KEY].numpy().tolist())
            return seen
        seen = one_epoch()
        # In memory: each worker decodes its own share (`--cache`).
        seen_cached = one_epoch(cache=True, seed=3)
        test_files = splits.split_files(name, splits.load_manifest(name), "test")
        dist = strategy.distribute_datasets_from_function(
            lambda c: dataset_fn(c, lambda ctx: input_pipeline.eval_dataset(test_files, 4, ctx)))
        # The eval builder's step count, as the trainer gets it.
        _, steps = input_pipeline.eval_input(strategy, test_files,
                                   TrainConfig(data=name, model_dir="-", global_batch_size=4))
        it = iter(dist)
        seen_test = []
        for _ in range(steps):
            for local in strategy.experimental_local_results(next(it)):
                w = local[input_pipeline.WEIGHT_KEY].numpy() > 0
                seen_test.extend(local[contract.INDEX_KEY].numpy()[w].tolist())
        result[name] = {"contexts": contexts, "share": share, "train": seen,
                        "train_cached": seen_cached, "test": seen_test,
                        "warnings": list(warnings)}
        warnings.clear()
    print("RESULT " + json.dumps(result))
''')


def test_two_workers_read_disjoint_shares_that_cover_the_split(tmp_path):
    """4 shards (by file) and 1 shard (by record, warned) for 2 workers."""
    many, one = str(tmp_path / "four"), str(tmp_path / "one")
    trainer_data.write_dataset(many, num_train=60, num_test=13, train_shards=4,
                               test_shards=2)
    trainer_data.write_dataset(one, num_train=61, num_test=13, train_shards=1,
                               test_shards=1)
    results = run_workers(lambda i: ["-c", INSPECT, many, one])
    workers = []
    for rc, out, err, _ in results:
        assert rc == 0, out[-2000:] + err[-4000:]
        (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
        workers.append(json.loads(line[len("RESULT "):]))
    assert [w["chief"] for w in workers] == [True, False]
    assert all(w["replicas"] == 2 for w in workers)
    for name, n, by_file in ((many, 60, True), (one, 61, False)):
        for i, w in enumerate(workers):
            r = w[name]
            # The strategy gave worker i pipeline i of 2, for each stream.
            assert r["contexts"] == [[2, i]] * 3
            # One epoch of each worker's own share; the longer share sets the
            # step count, so the shorter worker starts its next epoch.
            warned = [m for m in r["warnings"] if "sharding by record" in m]
            assert bool(warned) == (not by_file), r["warnings"]
        for stream in ("train", "train_cached"):
            shares = [w[name][stream][:w[name]["share"][i]] for i, w in enumerate(workers)]
            assert [len(set(s)) for s in shares] == workers[0][name]["share"]  # no repeats
            assert not set(shares[0]) & set(shares[1])  # disjoint
            assert set(shares[0]) | set(shares[1]) == set(range(n))  # complete
            if by_file:  # whole files: shard k holds the indices i with i % 4 == k
                assert set(shares[0]) == {i for i in range(n) if i % 4 in (0, 2)}
        tests = [w[name]["test"] for w in workers]
        assert not set(tests[0]) & set(tests[1])
        assert sorted(tests[0] + tests[1]) == list(range(13))


# The dataset these tests share (`trainer_dataset` in conftest).
DATASET = dict(num_train=256, num_test=37, train_shards=4, test_shards=1)


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_two_workers(trainer_dataset, tmp_path, loop):
    dataset = trainer_dataset(**DATASET)
    model_dir = str(tmp_path / "model")
    results = run_workers(lambda i: [
        "-m", "trainer", f"--data={dataset}", f"--model_dir={model_dir}",
        "--preset=smoke", "--strategy=multi_worker", f"--loop={loop}", "--epochs=2",
        "--global_batch_size=16", "--steps_per_execution=4", "--verbose=2",
        "--log_every=8"], log_level=False)
    for rc, out, err, _ in results:
        assert rc == 0, out[-2000:] + err[-4000:]
        assert "test_examples=37" in out
        assert "MultiWorkerMirroredStrategy, 2 replica(s)" in out
        assert "split 'test': 1 file(s) for 2 input pipelines" in err
        assert "split 'train'" not in err  # 4 files: sharded by file
    finals = [out.strip().splitlines()[-1] for _, out, _, _ in results]
    assert finals[0] == finals[1]  # same model, same metrics on both workers
    metrics = trainer_data.read_metrics(model_dir)
    assert metrics["replicas"] == 2 and metrics["train_steps"] == 2 * 16
    assert metrics["test_examples"] == 37
    names = os.listdir(model_dir)
    assert not [n for n in names if n.startswith("workertemp")], names
    assert {"export", "checkpoints", "logs", "metrics.json"} <= set(names)
    # Only the chief writes into model_dir: what each worker says it does...
    (_, _, chief_err, chief_pid), (_, _, other_err, other_pid) = results
    assert (f"chief: checkpoints to {model_dir}/checkpoints, "
            f"summaries to {model_dir}/logs") in chief_err
    scratch = f"{model_dir}/workertemp_worker_1"
    assert (f"non-chief worker: checkpoints to {scratch}/checkpoints, "
            f"summaries to {scratch}/logs") in other_err
    # ...and what is there: every event file is named after the chief's pid.
    events = [f for _, _, fs in os.walk(f"{model_dir}/logs") for f in fs
              if f.startswith("events.out.tfevents.")]
    assert events and all(f".{chief_pid}." in f for f in events), (chief_pid, events)
    assert not any(f".{other_pid}." in f for f in events)
    checkpoints = os.listdir(f"{model_dir}/checkpoints")
    assert any(n.endswith(".index") for n in checkpoints)
    assert not [f for _, _, fs in os.walk(f"{model_dir}/backup") for f in fs]


def test_corrupt_shard_on_one_worker_stops_both_with_clear_errors(tmp_path):
    """Worker 1 reads a corrupt shard of its own: it names the file; worker 0,
    left alone inside a collective, stops too (no hang) and says why."""
    data_dir = str(tmp_path / "data")
    trainer_data.write_dataset(data_dir, num_train=256, num_test=8, train_shards=4)
    bad = f"{data_dir}/{contract.shard_filename('train', 1, 4)}"  # worker 1's file
    trainer_data.corrupt(bad)
    results = run_workers(lambda i: [
        "-m", "trainer", f"--data={data_dir}", f"--model_dir={tmp_path}/model",
        "--preset=smoke", "--strategy=multi_worker", "--loop=custom", "--epochs=2",
        "--global_batch_size=16", "--steps_per_execution=4"])
    errors = []
    # Worker 1's data is bad input (2); worker 0 fails at run time (1).
    for (rc, out, err, _), status in zip(results, (1, 2)):
        assert rc == status and "Traceback" not in err, out[-2000:] + err[-4000:]
        (line,) = [l for l in err.splitlines() if l.startswith("error: ")]
        errors.append(line)
    assert errors[1].startswith(f"error: {bad}: corrupt TFRecord data (corrupted record at ")
    assert errors[0].startswith("error: another worker left during training (")

