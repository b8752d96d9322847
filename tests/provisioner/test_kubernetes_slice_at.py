"""A cluster kernel takes its slice at start whatever its rule's ``slice_at`` says (a pod gets its GPU from the
scheduler when it is created), and the server's log says so: nothing is ignored silently.  No cluster is
needed to judge the rule."""

from __future__ import annotations

import logging

import pytest

from jupyter_gpu_pool.config import load_settings
from jupyter_gpu_pool.kernel_provisioner.kubernetes import GPUPoolKubernetesProvisioner


@pytest.mark.parametrize("slice_at, said", [("first-cell", True), ("start", False)])
def test_a_cluster_kernel_whose_rule_says_first_cell_takes_its_slice_at_start_and_the_log_says_so(
        pool_home, caplog, slice_at, said):
    pool_home.configure(policy=[{"name": "lab", "slice_at": slice_at}])
    provisioner = GPUPoolKubernetesProvisioner(kernel_id="k-1", kernel_spec=None, parent=None)
    provisioner._pool = load_settings()  # what its pool() reads before it asks the cluster anything
    with caplog.at_level(logging.INFO, logger="jupyter_gpu_pool.kubernetes"):
        provisioner._note_slice_at("small")
    lines = [r.getMessage() for r in caplog.records if "first-cell" in r.getMessage()]
    assert lines == ([
        "kernel k-1: its rule 'lab' says slice_at: first-cell, but a cluster kernel's pod gets its GPU from the "
        "scheduler when it is created, so it takes its slice at start"] if said else [])
