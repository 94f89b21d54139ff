"""Job start at scale: which rank this is, and how the ranks of one job share one probe."""
