"""What one forward batch carries for the canary, and what kind of forward it is (the ground
floor: nothing here imports the runner, the monitor or the hooks)."""
