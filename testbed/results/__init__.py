"""What a run leaves: the figures gathered from the records (collect), the tables, the
report and its plots, and comparisons between runs."""
