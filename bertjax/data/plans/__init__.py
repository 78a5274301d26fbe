"""Stage 4, sample plans: which store tokens make each row of each step, a pure function of
(config, seed, epoch): NSP/SOP pairs, full sentences, token windows and packing (samples.py,
per store piece in piece_plans.py), the stateless shuffle, the row gather (rows.py), the batch
size of every step (batch_plan.py) and the row length of every step (schedule.py)."""
