"""The planner: pure functions from (ModelSpec, HardwareProfile, request) to a Plan. No I/O, no backends."""
