"""The model a deployment serves, pinned and fetched (``invoke pin``'s model part, ``invoke fetch-model``).

:mod:`.modelfetch` pins a Hub commit and fetches it (:func:`~.modelfetch.pin_model`,
:func:`~.modelfetch.fetch_model`); :mod:`.modelfiles` decides which files, what hashes and what a patch does
(pure); :mod:`.download` checks a file on disk or moves it through :mod:`.hub` (huggingface_hub behind
retries and clear errors); :mod:`.verified` is the one verified-file rule; :mod:`.secondaryfetch` does the
same for drafts, tokenizers and LoRAs.
"""
