"""``rigsmith.lock``, the resolved facts, and its history (``invoke lock --history``, ``--diff``, ``pin
--repin``, ``rollback``).

:mod:`.lock` reads and writes the lock (only pin, fetch-model and build write it); :mod:`.lockhistory`
keeps every change of it; :mod:`.lockdiff` says a change in words; :mod:`.repin` re-pins with consent.
"""
