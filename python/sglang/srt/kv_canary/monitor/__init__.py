"""Host-side watch over the device counters: violations, health, stats."""
