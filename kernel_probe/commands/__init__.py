"""One module per subcommand, named after it; each exposes add_<name>_arguments(parser) and
run_<name>(args)."""
