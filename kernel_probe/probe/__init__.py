"""The probe, stage by stage: plan -> check -> judge -> time -> choose -> write."""
