"""Recipe form (b): command text and pasted scripts — ``vllm serve``, ``python -m vllm…``, ``docker run`` /
``podman run`` (:mod:`.text`), a script run by bash in the jail (:mod:`.script`), a container's ``bash -c``
(:mod:`.bashc`), and the container options ``docker run`` and compose share (:mod:`.dockerrun`,
:mod:`.containeropts`). Entry points: ``text._from_shell`` and ``script.from_script``.
"""
