"""The run's report: `collect` (every rank's record -> the summary), `prediction` (the energy model against the
counter, the oracle), `monitor` (events to DeepSpeed's monitors), `files` (summary.json, report.txt, gantt.png)
and `text` (the report in words)."""
