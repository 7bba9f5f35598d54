"""Results turned into words, pages and files a person reads or runs: each command's verdict as
text (``optimize``, ``fleet``, ``forecast``, ``pareto``, ``fit``, ``sheet``, ``load``,
``features``, ``simulated``, with the shared helpers of ``render``), the self-contained HTML report
(``html.render_html``, generic; ``pages`` for optimize / fleet / forecast), what a command was
asked and assumed (``provenance``), and the launch scripts and Kubernetes manifest of an
optimize answer (``launch``).  Modules are imported by the commands that need them (matplotlib
and the flag tables load only then)."""
