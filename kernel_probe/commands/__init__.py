"""The subcommands, wired in kernel_probe.cli.SUBCOMMANDS: each exposes add_<name>_arguments(parser)
and run_<name>(args). locks: the commands that read a lock; anemoi: export and check-config; model:
model and check-model."""
