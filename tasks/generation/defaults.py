"""The local models' decoding defaults, declared once: the command line's options (tasks/config/commands.py) and
``GenerationParams`` (params.py) both take them from here, so DP-KPS and the only-LLM baseline decode alike.
Remote backends ignore them. This module imports nothing: the command line reads it before any stage loads."""

#: Seed-steering strength by default for local models (chosen on public DBPedia-14 test-split seeds,
#: docs/generation.md "Seed steering"): 4 raised seed-term coverage from 37 % to 86 % with no degenerate answer.
STEER_DEFAULT = 4.0
#: llama.cpp's repeat penalty for local models (1: off): at 1.0 SmolLM2-135M circled in about one demo document in
#: five ("The building ... a square shape, with a square shape of the building's design"); 1.15 took the circling
#: out, halved the calls and kept the documents' accuracy (experiments/results/generation.md, 2026-11-27).
REPEAT_PENALTY_DEFAULT = 1.15
#: Share of the seed terms the "budget" steering schedule makes a local model write before its answer may end: at
#: 1 (every term) SmolLM2-135M stuffed the last terms it could not place into the final sentence ("... reviewed by
#: several prominent authors in recent years agree."); at 0.8 (two of ten may stay out) it ends such answers a
#: sentence earlier, for 3 points of coverage and the same accuracy (experiments/results/generation.md, 2026-11-27).
STEER_END_COVERAGE_DEFAULT = 0.8
#: A token n-gram of this length is never repeated by local models (0: off).
NO_REPEAT_NGRAM_DEFAULT = 4
