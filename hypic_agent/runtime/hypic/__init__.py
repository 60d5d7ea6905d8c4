"""HYPIC: per-segment transition pairs, seam windows, state composition and the six modes."""
