"""`device=auto|cpu|cuda` under Ray's GPU assignment (client_app/devices.py). No GPU exists on the test
machines: CUDA's device count is given, and Ray is given logical GPUs, which it assigns and exposes
(`ray.get_gpu_ids()`, `CUDA_VISIBLE_DEVICES`) exactly as physical ones."""

import shutil
import tempfile

import pytest

from client_app.devices import DeviceError, DeviceFacts, choose_device, ray_gpu_ids


def test_outside_ray_auto_is_the_first_cuda_device_when_torch_sees_one():
    assert choose_device("auto", DeviceFacts(cuda_count=2)) == "cuda:0"
    assert choose_device("auto", DeviceFacts(cuda_count=0)) == "cpu"
    assert choose_device("cpu", DeviceFacts(cuda_count=2)) == "cpu"
    with pytest.raises(DeviceError, match="this node has no CUDA device"):
        choose_device("cuda", DeviceFacts(cuda_count=0))
    with pytest.raises(DeviceError, match="allowed: auto, cpu, cuda"):
        choose_device("gpu", DeviceFacts(cuda_count=0))


def test_a_ray_actor_given_no_gpu_trains_on_the_cpu_even_where_gpus_are_visible():
    facts = DeviceFacts(cuda_count=4, ray_gpu_ids=(), visible_devices=None)
    assert choose_device("auto", facts) == "cpu"
    with pytest.raises(DeviceError, match="client-resources-num-gpus"):
        choose_device("cuda", facts)


def test_a_ray_actor_uses_the_gpu_ray_assigned_it():
    # Ray restricted visibility to the assigned GPU (its default): it is torch's device 0
    assert choose_device("auto", DeviceFacts(1, ("3",), "3")) == "cuda:0"
    # a fraction of GPU 1 on a node where visibility is restricted to two GPUs
    assert choose_device("cuda", DeviceFacts(2, ("1",), "0,1")) == "cuda:1"
    # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: every GPU visible, the id is torch's index
    assert choose_device("auto", DeviceFacts(4, ("2",), None)) == "cuda:2"
    with pytest.raises(DeviceError, match="torch sees no CUDA device"):
        choose_device("auto", DeviceFacts(0, ("0",), "0"))


def test_outside_a_ray_worker_there_are_no_ray_gpu_ids():
    assert ray_gpu_ids() is None


@pytest.mark.slow
def test_ray_actors_given_whole_fractional_or_no_gpus_choose_their_device():
    ray = pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="bq-ray-", dir="/tmp")
    ray.init(address="local", num_cpus=4, num_gpus=3, include_dashboard=False,
             logging_level="ERROR", _temp_dir=temp, _node_ip_address="127.0.0.2")
    try:
        @ray.remote
        class Client:  # what a ClientApp actor sees; torch is told one GPU is visible
            def device(self) -> tuple:
                import os

                from client_app.devices import DeviceFacts, choose_device, ray_gpu_ids

                ids, visible = ray_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")
                count = 0 if not ids else len(visible.split(","))
                return ids, visible, choose_device("auto", DeviceFacts(count, ids, visible))

        whole = [Client.options(num_cpus=1, num_gpus=1).remote() for _ in range(2)]
        shares = [Client.options(num_cpus=0, num_gpus=0.25).remote() for _ in range(2)]
        none = Client.options(num_cpus=1, num_gpus=0).remote()
        got_whole = ray.get([a.device.remote() for a in whole])
        whole_ids = sorted(ids for ids, _, _ in got_whole)  # Ray picks which of the 3 GPUs
        assert all(len(ids) == 1 for ids in whole_ids) and len(set(whole_ids)) == 2  # one GPU each
        assert all(dev == "cuda:0" and vis == ids[0] for ids, vis, dev in got_whole)
        got_shares = ray.get([a.device.remote() for a in shares])
        (shared,) = {ids for ids, _, _ in got_shares}  # two quarters of one GPU, the one left over
        assert len(shared) == 1 and shared not in whole_ids
        assert sorted([*whole_ids, shared]) == [("0",), ("1",), ("2",)]
        assert all(dev == "cuda:0" and vis == shared[0] for _, vis, dev in got_shares)
        assert ray.get(none.device.remote()) == ((), "", "cpu")
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
