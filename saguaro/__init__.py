"""saguaro: the command line (bench, report, figures, calibrate, serve, simulate, plan, theory)."""
