"""One module per group of subcommands; each exposes add_<name>_arguments(parser) and run_<name>(args)."""
