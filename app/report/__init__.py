"""The utilization report: the waste analysis as rows, for scripts and spreadsheets."""
