"""The numbers a command reports, computed from parsed options with the library's closed forms
and simulator: the budget sheet (``sheet``), latency under load (``load``), the serving features
(``features``) and the features as the simulator ran them (``simulated``).  Each returns
JSON-ready dicts; ``servingmath.reports`` puts them into words.
"""
