"""What keeps a run safe and its ``model_dir`` whole, apart from the ML.

`outputs` is the ``model_dir`` layout, who writes where, and the commit of
the export with ``metrics.json``; `lock` lets one run at a time hold a
``model_dir``; `dataset_pin` records the data a run trains on and checks it
until the export; `checkpoints` finds the newest checkpoint that restores
and repairs the state file; `resume` refuses a resume with other settings;
`preemption` turns SIGTERM and SIGINT into a saved stop.
"""
