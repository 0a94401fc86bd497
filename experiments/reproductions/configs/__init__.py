"""Run configurations of the papers' GLUE fine-tuning experiments (JSON) and their runner (:mod:`.run`)."""
