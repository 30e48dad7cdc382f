"""Diagnosis: what a failed start says and what would have let it fit. Recognising llama.cpp's failure
lines (signatures, from configs/signatures.toml), reading a failed start's whole log (log_reading, failed_run,
own_lines, own_outcome), the remedies from a plan or from a log's numbers (remedies, number_remedies) and
their plain words (words, from configs/explain.toml).

Owns the reading of llama.cpp's output after the fact and the words that explain it. Pure: text and plans in,
findings out; must not probe devices, start processes or import the pipeline, run or the commands."""
