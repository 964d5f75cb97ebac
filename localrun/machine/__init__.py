"""What this machine is: the hardware probe (``hardware``: HardwareProfile of CPU, RAM, GPUs, disks),
named machine presets for `fit --preset` (``presets``), and measured speeds (``measurements``:
measurements.json, which callers pass into the planner)."""
