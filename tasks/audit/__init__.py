"""The empirical privacy audit: its statistics, its trials through the stages, and the faults that measure its power."""
