"""Choosing a strategy off a TPU (`trainer.strategy`), and the names it reports."""

from __future__ import annotations

import pytest
import tensorflow as tf

from trainer import strategy as strategy_lib
from trainer.errors import TrainerError


def test_strategies_off_a_tpu(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    assert strategy_lib.make_strategy("default") is tf.distribute.get_strategy()
    auto = strategy_lib.make_strategy("auto")
    assert auto.num_replicas_in_sync == 1 and strategy_lib.is_chief(auto)
    with pytest.raises(TrainerError, match="needs TF_CONFIG"):
        strategy_lib.make_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(TrainerError, match="TF_CONFIG is not valid JSON"):
        strategy_lib.make_strategy("multi_worker")


def test_public_strategy_names(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert strategy_lib.public_name(tf.distribute.get_strategy()) == "default"
    assert strategy_lib.public_name(tf.distribute.MirroredStrategy()) == "MirroredStrategy"
    assert strategy_lib.num_hosts(tf.distribute.get_strategy()) == 1
