"""The bundled RIM configs (``<name>.yaml``: what ``spec.reward.config`` and ``RIMReward("<name>")`` accept), shipped
as package data so that an installed wheel finds them as the source tree does (atlas_contract/checks.py)."""
