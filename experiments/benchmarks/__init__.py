"""Measurements rather than reproductions: speed and memory side by side with a reference (each prints ratios),
compile time, SVD strategies, the GLUE campaign's cost per run, and what the compiler proves (the lowering matrix,
the scale table)."""
