"""privseed stages: each module pairs pure functions (the math) with thin Prefect tasks (I/O, retries)."""

