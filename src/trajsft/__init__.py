"""trajsft: SFT a student on teacher agent trajectories."""
