"""localrun: run large language models on the hardware you already own.

Data flows one way: ``HardwareProfile`` + ``ModelSpec`` → ``Plan`` → ``backend.load(spec, plan)`` →
``Engine.stream(...)`` → chat UI / HTTP server / bench.
"""

__version__ = "0.1.0"
