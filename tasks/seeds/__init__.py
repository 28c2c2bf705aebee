"""The seed methods (one registry) and their math: DP vocabulary, DP-KDE sketches and samplers, per-class DP term
histograms, the passes over the private rows."""
