"""The engine image, pinned by digest or built (``invoke pin``'s image part, ``invoke build``).

:mod:`.build` is the entry (pin and build), over :mod:`.engine` (docker-py against Docker or Podman's API) and
:mod:`.registry` (a tag's manifest digest over the OCI distribution API); :mod:`.imagedef` reads
``images/NAME/image.yaml`` and :mod:`.image` renders its build context (pure); :mod:`.sources` and
:mod:`.archive` bring a source tree and its release assets; :mod:`.engineroute` says how a missing image
gets built.
"""
