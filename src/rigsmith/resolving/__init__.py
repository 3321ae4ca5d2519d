"""Resolving and pinning: what a deployment runs, found and fixed to exact bytes before anything starts.

Four groups of modules, each behind the CLI task named:

- **the model** (``invoke pin``, ``fetch-model``): :mod:`.modelfetch` pins a Hub commit and fetches it
  (:mod:`.modelfiles` decides which files and hashes, pure; :mod:`.download` moves and checks them through
  :mod:`.hub`, huggingface_hub behind retries; :mod:`.verified` is the one verified-file rule;
  :mod:`.secondaryfetch` does the same for drafts, tokenizers and LoRAs; :mod:`.netfail` tells "no route");
- **the image** (``invoke pin``, ``build``): :mod:`.build` over :mod:`.engine` (docker-py on Docker or Podman)
  and :mod:`.registry` (digests); :mod:`.imagedef` reads ``images/NAME/image.yaml``, :mod:`.image` renders its
  build context, :mod:`.sources` and :mod:`.archive` bring its source tree, :mod:`.engineroute` says how a
  missing image gets built;
- **the fit** (``invoke fit``, ``--propose``, ``--apply``): :mod:`.fit` counts each rank's memory from
  :mod:`.checkpoint`'s headers with :mod:`.fitparams` (the recipe's flags) and :mod:`.fitengine` (vLLM's
  rules by version), :mod:`.fitverdict` judges one card; :mod:`.layout` lists the layouts vLLM accepts,
  :mod:`.split` weights pipeline stages by free memory, :mod:`.propose` ranks them (:mod:`.proposewhy` says
  why in words, :mod:`.prescribe` the cheapest fix), :mod:`.applylayout` writes one into the spec;
  :mod:`.calibrate` corrects the allowances from what the engine reported on this rig;
- **the lock** (``rigsmith.lock``): :mod:`.lock` is the resolved facts, :mod:`.lockhistory` every change of
  it, :mod:`.lockdiff` a change in words, :mod:`.repin` a re-pin with consent.
"""
