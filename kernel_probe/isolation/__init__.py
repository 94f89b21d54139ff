"""Foreign code runs only here: child processes, the worker, and the typed messages between them."""
