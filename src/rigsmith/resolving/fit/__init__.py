"""Fit before you fetch: what each vLLM rank needs in GPU memory, and the layouts that fit the rig
(``invoke fit``, ``--propose``, ``--apply``). Pure but for :mod:`.checkpoint`'s range requests.

:mod:`.fit` counts each rank from :mod:`.checkpoint`'s safetensors headers with :mod:`.fitparams` (the
recipe's flags) and :mod:`.fitengine` (vLLM's own rules by version); :mod:`.fitverdict` judges one card;
:mod:`.calibrate` corrects the allowances from what the engine reported on this rig. :mod:`.layout` lists
the layouts vLLM accepts, :mod:`.split` weights pipeline stages by free memory, :mod:`.propose` ranks them
(:mod:`.proposewhy` says why in words, :mod:`.prescribe` the cheapest fix) and :mod:`.applylayout` writes
one into the spec.
"""
