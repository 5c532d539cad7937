"""What a run reports: metrics as it trains (``monitor``) and to the trackers (``trackers``), and
afterwards, read back from its run directory (``run_metrics``), its summary (``summary``) and plots
(``plots``), which ``python -m advpt.report`` prints."""
