"""A real Kubernetes on one machine, without Docker: the control plane built from the upstream Go modules
(versions.py, build.py), run as supervised processes (component.py, processes.py: one class per component in
controlplane.py and controllers.py), process nodes in the kubelet's place (node/), with the project's CRDs, chart
and operator installed (cluster.py) — ``atlas cluster up`` (cli.py) and the real-Kubernetes test tier (tests/kube/).

It imports neither half of the project (atlas_core, atlas_operator): it installs the chart and CRDs as files and
starts the operator as a process.
"""
