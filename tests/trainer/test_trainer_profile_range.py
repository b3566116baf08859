"""``--profile_steps`` past the end of the run is refused once the run's length
is known: a bad flag, exit 2."""

from __future__ import annotations

from trainer.__main__ import main


def test_profile_steps_beyond_the_run_are_one_line(trainer_dataset, tmp_path, capsys):
    data = trainer_dataset(num_train=400, num_test=40)  # 25 steps per epoch at batch 16
    model_dir = tmp_path / "model"
    code = main([f"--data={data}", f"--model_dir={model_dir}", "--preset=smoke",
                 "--epochs=2", "--global_batch_size=16", "--profile_steps=40,60"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == ("error: --profile_steps=40,60 ends after the run's 50 steps "
                       "(2 epoch(s)); profile steps within 1..50")
    assert not model_dir.exists()  # refused before anything was written
