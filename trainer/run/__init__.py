"""What keeps a run safe and its ``model_dir`` whole, apart from the ML.

`preflight` makes every check before the run writes anything and settles
the `preflight.Run` the run's parts share, with its numbers derived once
(`plan.Plan`) and the settings each part takes (`plan`); `outputs` is the ``model_dir``
layout, who writes where, and the commit of the export with
``metrics.json``; `lock` lets one run at a time hold a
``model_dir``; `dataset_pin` records the data a run trains on and checks it
until the export; `claim` says from when the chief may write and stops a
run that lost its lock; `checkpoints` saves and restores the run's model,
optimizer and history; `checkpoint_repair` finds the newest checkpoint that
restores and repairs the state file; `resume` refuses a resume with other
settings; `preemption` turns SIGTERM, SIGINT and SIGHUP into a stop.
"""
