"""The privacy floor: noise mechanisms and their calibration, accounting, the ledger and draw-once store, keyed
identity."""
