"""Stage 5, corruption: what an objective trains on, applied per batch and keyed by (seed, epoch,
sample index): MLM masking in all its forms (masking.py), MacBERT's similar words
(similarity.py), PERT's permutation (permutation.py) and causal-LM targets (causal.py)."""
