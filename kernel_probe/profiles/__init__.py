"""Site profiles: the format, finding them, recognising a site, and what a site requires."""
