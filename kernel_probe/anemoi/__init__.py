"""Everything anemoi on the probe's side: reading configs, Hydra composition, schema checks,
export."""
