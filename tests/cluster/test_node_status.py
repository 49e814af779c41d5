"""What a process node patches into a pod's status (atlas_cluster/node/status.py): the conditions' transition
times, and when the API's copy of the status is put back."""

from __future__ import annotations

from atlas_cluster.node.status import PodStatus, says_the_same


def conditions(**statuses):
    return [{"type": name, "status": status} for name, status in statuses.items()]


def test_the_same_phase_and_condition_statuses_say_the_same():
    ours = {"phase": "Running", "conditions": conditions(Ready="True", ContainersReady="True")}
    posted = {"phase": "Running", "conditions": conditions(Ready="True", ContainersReady="True", Other="False")}
    assert says_the_same(posted, ours)


def test_a_pod_marked_not_ready_behind_the_nodes_back_is_put_back():
    ours = {"phase": "Running", "conditions": conditions(Ready="True")}
    assert not says_the_same({"phase": "Running", "conditions": conditions(Ready="False")}, ours)
    assert not says_the_same({"phase": "Running", "conditions": []}, ours)
    assert not says_the_same({"phase": "Pending", "conditions": conditions(Ready="True")}, ours)


def test_a_condition_keeps_its_transition_time_until_its_status_changes():
    status = PodStatus()
    status.transitions = {}
    ready = status._condition("Ready", True, "ContainersNotReady")
    assert ready["status"] == "True" and "reason" not in ready
    status.transitions["Ready"] = ("True", "2026-01-01T00:00:00Z")  # as if set a while ago
    assert status._condition("Ready", True)["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    not_ready = status._condition("Ready", False, "ContainersNotReady")
    assert not_ready["status"] == "False" and not_ready["reason"] == "ContainersNotReady"
    assert not_ready["lastTransitionTime"] != "2026-01-01T00:00:00Z"
