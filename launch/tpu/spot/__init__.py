"""Spot runs of ``launch.tpu run``: `decide` picks the next action from what
was observed, `launch.tpu.cloud` observes and acts through gcloud, `events` and
`journal` record the run, `runner` loops until the trainer exits."""
