"""A module that ends the interpreter when it is imported (``SystemExit``): a checker that imports
it must report it, never end with it."""

raise SystemExit(3)
