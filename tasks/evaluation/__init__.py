"""What the recipient measures: classifiers, evaluation, the report, the experiment grid and its table, baselines, the
whole-pipeline canary test."""
