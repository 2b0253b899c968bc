from testbed.base.procutil import takes_custom_slice


def test_only_kernels_that_honour_a_custom_slice_are_said_to_have_one():
    """Before 6.12 sched_setattr accepts a fair-class slice and ignores it: the results must
    not claim one (the Vagrant/VM-test guest runs 6.1)."""
    assert takes_custom_slice("6.18.44-fc-v1098") and takes_custom_slice("6.12.0")
    assert takes_custom_slice("7.0.1-arch1")
    assert not takes_custom_slice("6.1.0-50-amd64") and not takes_custom_slice("5.15.0-91")
    assert not takes_custom_slice("weird")
