"""``invoke upgrade`` and ``invoke rollback``: move a deployment to a new lock only when it benches as well,
and put a recorded lock back.

Entry points: ``upgrade.upgrade`` (repin → fetch → build → deploy → stop the old → up → wait → bench, with
an automatic rollback when the new one fails or regresses), ``rollback.rollback`` (a recorded lock back
with its model files, artifacts and image, and the deployment restarted on it) and ``lastgood`` (the
last-known-good kept until the new one passes: model files as hard links, the image by a tag).
"""
