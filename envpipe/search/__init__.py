"""Configuration search (Aceso-style): per-layer profile -> stage count, layer cut, micro-batch size and count,
data-parallel degree, order -> clock plan. Pure and torch-free, like envpipe.plan."""
