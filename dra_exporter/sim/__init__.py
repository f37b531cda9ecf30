"""The simulated node: fake NVML, kubelet pod-resources server and scenarios.

Lets anyone run the real code paths without a GPU or a cluster; every test uses it.
"""
