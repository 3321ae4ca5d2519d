"""Operating a deployment on a host: one package per capability, each named for what it does.

``host`` (the one way an op runs a command, and ``gather``: probe output → ``HostFacts``), ``probes`` (each
probe's argv and its pure parser) and ``checkrow`` (one row of a go/no-go table) are the floor every
package stands on. ``doctor/`` says whether this host can run the spec; ``fit/`` sizes the spec against this
rig's GPUs and proposes layouts; ``lifecycle/`` starts, checks, waits on, stops and reports one deployment
(``invoke up/down/status/logs/wait/next/proxy-entry``); ``cluster/`` does doctor and lifecycle across the
nodes of a multi-node deployment; ``bench/`` measures a running deployment and keeps the history;
``upgrade/`` moves it to a new lock behind a bench gate and rolls back; ``bundle/`` carries it to an
air-gapped machine and proves it runs there with no route out.
"""
