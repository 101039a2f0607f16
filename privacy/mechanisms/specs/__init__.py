"""What each mechanism is, as the registry lists it (:class:`~uedp.privacy.mechanisms.registry.MechanismSpec`):
its name, unit, parameters, how it is planned and checked. One module per mechanism module of the package
above, importing nothing of its machinery (torch, dp_accounting) until a mechanism is built or planned, so
that the CLI's flags, the configuration models and the privacy ledger name the mechanisms in a fraction of
a second. What a mechanism does when it trains is its own module (:mod:`..dpsgd`, :mod:`..userdp`, ...)."""
