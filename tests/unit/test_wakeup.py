import os
import struct

from testbed.run.wakeup import cpus_kept_awake


def test_the_request_is_written_and_held_for_the_block(tmp_path):
    dev, drv = tmp_path / "cpu_dma_latency", tmp_path / "driver"
    dev.write_bytes(b"")
    drv.write_text("haltpoll\n")
    fds_before = set(os.listdir("/proc/self/fd"))
    with cpus_kept_awake(True, str(dev), str(drv)) as state:
        assert state.to_json() == {"held": True, "max_latency_us": 0,
                                   "cpuidle_driver": "haltpoll"}
        assert len(set(os.listdir("/proc/self/fd")) - fds_before) == 1  # held open
    assert struct.unpack("=i", dev.read_bytes()) == (0,)
    assert set(os.listdir("/proc/self/fd")) == fds_before  # closed: the kernel drops it


def test_a_missing_device_is_recorded_not_pretended(tmp_path):
    with cpus_kept_awake(True, str(tmp_path / "none"), str(tmp_path / "nodriver")) as state:
        assert state.held is False and state.max_latency_us is None
        assert "No such file" in state.note and state.cpuidle_driver is None


def test_no_cpuidle_driver_means_the_request_changes_nothing(tmp_path):
    dev, drv = tmp_path / "dev", tmp_path / "driver"
    dev.write_bytes(b"")
    drv.write_text("none\n")
    with cpus_kept_awake(True, str(dev), str(drv)) as state:
        assert state.held is True and "changes nothing" in state.note


def test_switched_off_by_the_scenario(tmp_path):
    dev = tmp_path / "dev"
    dev.write_bytes(b"")
    with cpus_kept_awake(False, str(dev), str(tmp_path / "d")) as state:
        assert state.held is False and "keep_cpus_awake" in state.note
    assert dev.read_bytes() == b""
