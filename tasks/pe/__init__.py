"""Private evolution (Aug-PE, SecPE): votes, selection, secret noise, the per-unit work on the workers."""
