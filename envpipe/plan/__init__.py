"""Pure planning: schedules, EnvPipe policies, reconfiguration, simulator, plan I/O and rendering."""
