"""Seeds to documents: prompts, candidate rounds, row assembly, the generation drivers."""
