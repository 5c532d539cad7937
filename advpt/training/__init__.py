"""Engines, schedules, the training loop, checkpoints and monitoring."""
