"""The accountants' and adjacencies' names, apart from dp_accounting (seconds to import): the configuration
models and the CLI's flags name them without loading the accountants."""

from __future__ import annotations

from typing import Literal

AccountantKind = Literal["pld", "rdp"]


ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")


# Adjacency of the privacy unit: "add_remove" (a unit present or absent: users, sequences) or "replace"
# (a unit's value changed, its place kept: Selective DP's F-neighbours, one sensitive token's value).
# dp_accounting's REPLACE_ONE models records bounded by the sensitivity on either side, sampled by the
# same coin, so a clipped contribution of norm <= beta needs no extra factor 2 here. Only PLD supports
# it for Poisson sampling.
Adjacency = Literal["add_remove", "replace"]
