"""What the experiments share: result tables with their provenance (``report``) and the accelerator machinery
(``accelerator_suite``: the test suite on one backend; ``accelerator_bundle``: wheels for a machine without an index)."""
