"""Air-gapped rigs: ``invoke bundle`` carries one deployment, verified, to a machine without internet;
``invoke unbundle`` checks and places it there; ``up --offline`` proves it runs with no route out.

Entry points: ``bundle.bundle`` (spec, lock, artifacts, model files, source trees and the image into one
directory or tar), ``unbundle.unbundle`` (every member checked against the manifest and the lock before
anything is placed), ``manifest`` (the bundle's format and what both directions share; its member rule),
``ociarchive`` (the image exported with its digest kept, and loaded back), ``offline.up_offline`` and
``netwatch`` (a network namespace with no route out, and every attempt to leave it named host:port).
"""
