"""Model-side pieces shared by `refs` and `train`: per-sequence log-probs and the DPO losses."""
