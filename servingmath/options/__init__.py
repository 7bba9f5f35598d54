"""Command-line argument groups by role: each module declares one group of options
(``add_*_arguments``) and turns the parsed values into specs, raising ``UsageError`` with a
one-line fix for anything a user can get wrong.

``validators`` holds the argparse ``type=`` checks every group uses; ``deployment`` the model,
GPU and parallelism; ``problem`` the search problem of ``optimize``, ``fleet``, ``forecast`` and
``pareto``, with its knob grid in ``grid`` and speculative decoding in ``speculation``; ``load``
the workload and scheduler; ``features`` the serving features; ``disagg`` the two pools;
``posterior`` and ``calibration`` the efficiencies; ``run_fill`` what benchmark files leave out;
``outputs`` the files a command writes.  ``fit``, ``optimize``, ``fleet``, ``forecast`` and
``pareto`` each declare one command's whole argument list from these groups and its own options.
"""
