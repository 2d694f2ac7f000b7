"""`saguaro report`: bench run folders read back (analysis), drawn (figures) and written as one Markdown report
(report; client runs' section in serving_report).

Nothing is imported here: `saguaro bench` reads its run folders through analysis without loading the report's
figures."""
