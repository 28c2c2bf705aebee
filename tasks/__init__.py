"""privseed stages: each module pairs pure functions (the math) with thin Prefect tasks (I/O, retries)."""

__version__ = "0.1.0"
