"""The command models (one pydantic model per command, built from option groups) and the checks made before a run
starts."""
