"""privseed: differentially private seeds for LLM-written synthetic text corpora.

The installed package is ``privseed``; the repository keeps the pipeline's two halves as top-level folders, linked
here so that one copy of the source serves both the repository layout and the import path:

- ``privseed.tasks`` (``tasks/``): the stages, each a pure function (the math) and a thin Prefect task (I/O);
- ``privseed.flows`` (``flows/``): the Prefect flows that wire those tasks, and the command line.

Importing ``privseed`` imports nothing heavy and changes no process-wide setting.
"""

from importlib.metadata import version as _version

#: The installed distribution's version (pyproject.toml is its one source).
__version__: str = _version("privseed")
