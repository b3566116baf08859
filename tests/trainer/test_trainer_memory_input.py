"""The in-memory training input (``--cache``): each pipeline's share decoded
once, every epoch a seeded permutation of it, resume by arithmetic.

Runs in the test process on TF's ``ram://`` filesystem, ``InputContext``
objects built by hand to play the role of several hosts (tests/trainer/
input_helpers.py, as in test_trainer_input.py). The two-replica runs of both
loops, resumed and compared bit for bit, are in test_trainer_memory_resume.py.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import mnist_contract as contract
from tests import trainer_data
from tests.trainer.input_helpers import batches, context, indices, ram_dir, split
from trainer import __main__ as cli
from trainer.data import in_memory, input_pipeline

LOGGER = "trainer.data.input_pipeline"


def memory_stream(files, batch: int, ctx, **kwargs) -> tf.data.Dataset:
    return input_pipeline.train_dataset(files, batch, ctx, cache=True, **kwargs)


def share_indices(files, ctx) -> list[int]:
    """The example indices of a pipeline's share, in its decoded row order."""
    return input_pipeline.decode_share(files, ctx)[contract.INDEX_KEY].numpy().tolist()


def expected_stream(share: list[int], seed: int, pipeline: int, first_position: int,
                    count: int) -> list[int]:
    """The example indices at stream positions ``first_position`` onwards,
    computed from `in_memory.epoch_order` alone (no dataset)."""
    n = len(share)
    epoch, offset = divmod(first_position, n)
    out: list[int] = []
    while len(out) < offset + count:
        out.extend(share[r] for r in in_memory.epoch_order(n, (seed, pipeline), epoch).numpy())
        epoch += 1
    return out[offset:offset + count]


@pytest.mark.parametrize("pipelines,replicas,num_files", [(1, 1, 4), (1, 2, 4), (2, 2, 4),
                                                          (2, 2, 1)])
def test_every_epoch_holds_each_example_of_the_share_once(pipelines, replicas, num_files,
                                                          caplog):
    """42 examples: shares of 42 or 21 that batches of 4 or 8 do not divide,
    so batches straddle epoch ends; nothing is dropped or repeated."""
    files = split(ram_dir(), num_train=42, train_shards=num_files)
    per_replica = 8 // replicas
    seen = []
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for i in range(pipelines):
            ctx = context(pipelines, i, replicas)
            share = share_indices(files, ctx)
            n = len(share)
            bs = batches(memory_stream(files, 8, ctx, seed=3), 3 * n // per_replica + 1)
            for b in bs:  # static, full, normalized batches
                assert b[contract.IMAGE_KEY].shape == (per_replica, 28, 28, 1)
                assert b[contract.IMAGE_KEY].dtype == np.float32
                assert (b[input_pipeline.WEIGHT_KEY] == 1).all()
            stream = indices(bs)
            epochs = [stream[e * n:(e + 1) * n] for e in range(3)]
            assert all(sorted(e) == sorted(share) for e in epochs)
            assert epochs[0] != epochs[1] != epochs[2]  # reshuffled each epoch
            seen.extend(share)
    assert sorted(seen) == list(range(42))  # the shares: disjoint and complete
    taken = [r.getMessage() for r in caplog.records if "--cache" in r.getMessage()]
    assert len(taken) == pipelines and all("decoded once" in m for m in taken), taken


@pytest.mark.parametrize("pipelines,num_files", [(2, 4), (3, 6), (2, 1)])
def test_each_pipeline_decodes_only_its_share(pipelines, num_files):
    files = split(ram_dir(), num_train=60, train_shards=num_files)
    counts = input_pipeline.pipeline_example_counts(files.counts, pipelines)
    for i in range(pipelines):
        got = share_indices(files, context(pipelines, i, pipelines))
        # write_dataset deals example k to shard k % num_files.
        if num_files >= pipelines:
            want = [k for k in range(60) if k % num_files % pipelines == i]
        else:
            want = list(range(i, 60, pipelines))
        assert sorted(got) == want and len(got) == counts[i]


def test_decoded_pixels_and_labels_are_the_written_ones():
    files = split(ram_dir(), num_train=24, train_shards=3)
    arrays = input_pipeline.decode_share(files, context(1, 0, 1))
    images, labels = trainer_data.make_arrays(24, 0)
    order = arrays[contract.INDEX_KEY].numpy()
    assert arrays[contract.IMAGE_KEY].dtype == tf.uint8
    np.testing.assert_array_equal(arrays[contract.IMAGE_KEY].numpy(), images[order])
    np.testing.assert_array_equal(arrays[contract.LABEL_KEY].numpy(), labels[order])


@pytest.mark.parametrize("pipelines,replicas", [(1, 1), (1, 2), (2, 2)])
def test_a_seeded_stream_resumes_where_it_stood(pipelines, replicas):
    """40 examples, global batch 8: step 7 lies inside the share's second
    epoch, so the resumed stream enters an epoch at an offset."""
    files = split(ram_dir(), num_train=40, train_shards=4)
    per_pipeline, per_replica = replicas // pipelines, 8 // replicas
    for i in range(pipelines):
        ctx = context(pipelines, i, replicas)
        full = indices(batches(memory_stream(files, 8, ctx, seed=5), 12 * per_pipeline))
        again = indices(batches(memory_stream(files, 8, ctx, seed=5), 12 * per_pipeline))
        assert full == again
        tail = indices(batches(memory_stream(files, 8, ctx, seed=5, start_step=7),
                               5 * per_pipeline))
        assert tail == full[7 * per_pipeline * per_replica:]
        assert full == expected_stream(share_indices(files, ctx), 5, i, 0, len(full))


def test_resume_far_into_the_stream_is_arithmetic(caplog):
    """Step 2**40 (~10^12) of a 36-example share: a stream that read or dropped
    the batches before it would not get there; this one starts there."""
    files = split(ram_dir(), num_train=36, train_shards=2)
    ctx, step = context(1, 0, 2), 2 ** 40
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = indices(batches(memory_stream(files, 8, ctx, seed=9, start_step=step), 6))
    first = input_pipeline.consumed_batches(step, ctx) * 4
    assert got == expected_stream(share_indices(files, ctx), 9, 0, first, 24)
    epoch, offset = divmod(first, 36)
    assert (f"resuming the seeded in-memory input at step {step}: epoch {epoch} of the "
            f"share, from its example {offset}") in caplog.text


def test_an_unseeded_stream_starts_a_fresh_shuffle_on_resume():
    files = split(ram_dir(), num_train=40, train_shards=2)
    ctx = context(1, 0, 1)
    one = indices(batches(memory_stream(files, 8, ctx, start_step=7), 5))
    two = indices(batches(memory_stream(files, 8, ctx, start_step=7), 5))
    assert sorted(one) == sorted(two) == list(range(40))  # whole epochs from the start
    assert one != two  # a fresh random key each time


def test_epoch_order_is_a_keyed_permutation():
    n, key = 500, (4, 0)
    first = in_memory.epoch_order(n, key, 0).numpy()
    assert sorted(first) == list(range(n))
    np.testing.assert_array_equal(first, in_memory.epoch_order(n, key, 0).numpy())
    others = [in_memory.epoch_order(n, k, e).numpy()
              for k, e in [(key, 1), (key, 2 ** 33), ((5, 0), 0), ((4, 1), 0),
                           ((4 + 2 ** 40, 0), 0)]]
    assert all(sorted(o) == list(range(n)) and not np.array_equal(o, first)
               for o in others)


def test_the_permutation_mixes_the_whole_epoch():
    """Unlike a shuffle buffer, which can only hand out the rows it has
    read: with a 200-row buffer the first 200 draws of an epoch come from
    rows below 400, and position and row are strongly correlated."""
    n = 2000
    for epoch in range(3):
        order = in_memory.epoch_order(n, (1, 0), epoch).numpy()
        assert (order[:200] >= 1000).mean() > 0.35
        assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.1
    buffered = list(tf.data.Dataset.range(n).shuffle(200, seed=1).as_numpy_iterator())
    assert max(buffered[:200]) < 400  # what the first assertion rules out


def test_the_memory_bound_picks_the_path_and_the_log_says_which(caplog):
    files = split(ram_dir(), num_train=40, train_shards=2)
    ctx = context(1, 0, 1)
    need = in_memory.decoded_bytes(40)
    assert need == 40 * (28 * 28 + 16)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        memory_stream(files, 8, ctx, seed=1, memory_bound=need)
        memory_stream(files, 8, ctx, seed=1, memory_bound=need - 1, start_step=3)
    lines = [r.getMessage() for r in caplog.records]
    assert any("within the in-memory bound" in m and "decoded once" in m for m in lines)
    assert any("over the in-memory bound" in m and "streamed from the files through a "
               "10000-record shuffle buffer" in m for m in lines)
    # The streamed path's own resume: it skips the consumed batches.
    assert any("skipping 3 batches of 8" in m for m in lines)


def test_the_bound_is_a_fraction_of_the_host_memory(caplog):
    host = in_memory.host_memory_bytes()
    assert host > 2 ** 28  # a real figure from the OS, not a default
    assert in_memory.memory_bound(host) == int(host * in_memory.MEMORY_FRACTION)
    assert in_memory.fits_in_memory(1000, in_memory.decoded_bytes(1000))
    assert not in_memory.fits_in_memory(1001, in_memory.decoded_bytes(1000))
    files = split(ram_dir(), num_train=16, train_shards=2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        memory_stream(files, 8, context(1, 0, 1))
    assert f"({in_memory.MEMORY_FRACTION:g} of this host's memory, " in caplog.text


def _cgroups(root, proc_lines, limits):
    """A fake cgroup tree under ``root``: ``limits`` maps file paths below it
    to their content; ``proc_lines`` is this process's /proc/self/cgroup."""
    for name, text in limits.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    (root / "proc-cgroup").write_text("".join(f"{line}\n" for line in proc_lines))


@pytest.mark.parametrize("proc_lines, limits, expected", [
    (["0::/pod/c1"], {"pod/c1/memory.max": "max", "pod/memory.max": "2147483648"},
     2147483648),  # v2: the pod's limit over the container's none
    (["0::/"], {"memory.max": "1073741824"}, 1073741824),  # v2 inside a cgroup namespace
    (["4:memory:/docker/x", "0::/"],
     {"memory/docker/x/memory.limit_in_bytes": "536870912",
      "memory/memory.limit_in_bytes": "9223372036854771712"}, 536870912),  # v1
    (["4:memory:/a", "0::/a"], {"unified/a/memory.max": "300000000",
                                "memory/a/memory.limit_in_bytes": "400000000"}, 300000000),
    (["4:memory:/a", "0::/a"], {"memory/a/memory.limit_in_bytes": "9223372036854771712"},
     None),  # no limit anywhere
    (["1:cpu:/a"], {}, None),
])
def test_the_cgroup_memory_limit_is_the_lowest_on_the_way_up(tmp_path, monkeypatch,
                                                            proc_lines, limits, expected):
    _cgroups(tmp_path, proc_lines, limits)
    monkeypatch.setattr(in_memory, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(in_memory, "PROC_CGROUP", str(tmp_path / "proc-cgroup"))
    assert in_memory.cgroup_memory_limit() == expected


def test_a_container_limit_below_the_hosts_memory_bounds_the_share(tmp_path, monkeypatch,
                                                                  caplog):
    """A pod limited to 4 KB on a host of gigabytes: 16 examples (12.8 KB
    decoded) are over a quarter of the limit, so they are streamed, and the
    log names the limit (the host's memory would have held them)."""
    _cgroups(tmp_path, ["0::/pod"], {"pod/memory.max": "4096"})
    monkeypatch.setattr(in_memory, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(in_memory, "PROC_CGROUP", str(tmp_path / "proc-cgroup"))
    files = split(ram_dir(), num_train=16, train_shards=2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        memory_stream(files, 8, context(1, 0, 1))
    assert ("over the in-memory bound of 0.0 MB (0.25 of this process's cgroup memory "
            "limit, 0.0 MB): streamed from the files") in caplog.text


def test_a_bad_record_is_named_when_the_share_is_decoded(tmp_path, capsys):
    out = str(tmp_path / "data")
    trainer_data.write_dataset(out, num_train=20, num_test=20, train_shards=2, test_shards=2)
    path = trainer_data.replace_record(out, "train", 1, 2, 3,
                                       trainer_data.example_bytes(bytes(784), 42))
    status = cli.main([f"--data={out}", f"--model_dir={tmp_path / 'm'}", "--preset=smoke",
                       "--epochs=1", "--global_batch_size=8", "--steps_per_execution=2",
                       "--verbose=0", "--cache", "--loop=custom"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [
        f"error: {path}: record 3 of split 'train': label 42 is not a class (0-9)"]
