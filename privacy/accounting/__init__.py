"""Privacy accounting, computed by ``dp_accounting`` (never by hand), in one module per concern:

- :mod:`.events`: a training round as a ``DpEvent`` (Poisson-sampled Gaussian, group replacement),
  epsilon after a number of rounds with the ``pld`` (tightest, the default for reported figures) or
  ``rdp`` accountant, and the adjacency (add/remove or replace-one) each unit has;
- :mod:`.calibration`: the noise multiplier for a target epsilon, and the check on delta;
- :mod:`.rounds`: the round loop's accountant and its schedule, planned before round 1 (where a budget
  stops a run, the exact epsilon of every round it shows);
- :mod:`.worst_case`: uedp's worst case (the DP bound on users sampled a round, the two cases);
- :mod:`.composition`: several releases of one text composed, for the privacy ledger.

Both accountants give upper bounds, so both are sound to report; every run says which one it used.
Nothing is re-exported here: each caller imports from the module that holds what it uses.
"""
