"""The TPU VM launcher: `launch.tpu.config` holds a launch's settings
(`TpuConfig`), `launch.tpu.topology` knows the slices, `launch.tpu.commands`
builds the gcloud and host commands, `launch.tpu.states` reads the trainer's
state back from the hosts, `launch.tpu.cloud` runs the commands (each step,
and the spot runs' calls), `launch.tpu.cli` parses the flags and runs the
steps, `launch.tpu.spot` runs ``run`` until the trainer exits (a subpackage:
its runner and `launch.tpu.cloud` use each other's parts)."""
