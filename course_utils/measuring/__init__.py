"""What a lesson times and probes: the device, the timer, memory (named so that cu.measure stays the timer)."""
