"""A notebook's grid on Ray (`ff.run_many(backend="ray")`): the same Histories as the local pool, the same cache,
a retried task that resumes after its worker is killed, and clear errors. A local Ray instance of 2 CPUs on
127.0.0.1, in its own temp folder, is started by this module and stopped at its end (only what it started)."""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import cluster

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def local_ray():
    temp = tempfile.mkdtemp(prefix="ffray")  # short: Ray's socket paths must stay under the OS limit
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp, _node_ip_address="127.0.0.1",
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def smoke_cfgs():
    return [tiny_config(seed=s, rounds=3) for s in range(4)]


def test_ray_gives_the_local_pools_histories_and_a_second_call_sends_nothing(local_ray, tmp_path, monkeypatch):
    cfgs = smoke_cfgs()
    pool = ff.run_many(cfgs, root=tmp_path / "pool", workers=2, progress=False)
    on_ray = ff.run_many(cfgs, root=tmp_path / "ray", backend="ray", progress=False)
    assert all(a.same_as(b) for a, b in zip(pool, on_ray))
    sent = []
    monkeypatch.setattr(cluster, "run_tasks", lambda *a, **k: sent.append(a) or [])
    again = ff.run_many(cfgs, root=tmp_path / "ray", backend="ray", progress=False)
    assert not sent and all(h.cached for h in again)
    assert all(a.same_as(b) for a, b in zip(on_ray, again))


def test_the_address_variable_chooses_ray_for_every_caller(local_ray, tmp_path, monkeypatch):
    monkeypatch.setenv(cluster.ADDRESS_ENV, "local")  # already connected here: the connection is used as it is
    used = []
    original = cluster.run_tasks
    monkeypatch.setattr(cluster, "run_tasks", lambda *a, **k: used.append(1) or original(*a, **k))
    ff.run_many(smoke_cfgs()[:1], root=tmp_path, progress=False)
    assert used


def test_a_run_that_raises_is_named_and_the_others_finish(local_ray, tmp_path):
    good = tiny_config(seed=0)
    bad = tiny_config(seed=1, dataset="cifar10", data_root=str(tmp_path / "no-cifar-here"))
    with pytest.raises(RuntimeError, match=rf"1 of 2 runs failed on Ray .*{ff.experiments.config_key(bad)} "
                                           rf"\(fedavg, seed 1\): .*cifar10"):
        ff.run_many([good, bad], root=tmp_path / "r", backend="ray", progress=False)
    assert ff.run_many([good], root=tmp_path / "r", backend="local", progress=False)[0].cached


def test_a_results_root_the_workers_cannot_write_is_named(local_ray, tmp_path):
    root = tmp_path / "a-file"
    root.write_text("not a folder")
    with pytest.raises(ValueError, match="cannot write the results root"):
        ff.run_many(smoke_cfgs()[:1], root=root, backend="ray", progress=False)


def _task_pids():
    found = []
    for p in psutil.Process().children(recursive=True):  # only what this test process started
        try:
            if "_ray_task" in " ".join(p.cmdline()):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def test_a_killed_worker_is_retried_and_resumes_to_the_uninterrupted_history(local_ray, tmp_path):
    cfg = ff.Config(dataset="digits", n_clients=10, rounds=30, warmup_rounds=10, method="fedfrozen", seed=3,
                    device="cpu", eval_every=5)
    root = tmp_path / "kill"
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("h", ff.run_many(
        [cfg], root=root, backend="ray", progress=False, checkpoint_seconds=0)))
    worker.start()
    partial = root / "default" / f".{ff.experiments.config_key(cfg)}.partial"
    deadline, killed = time.time() + 120, []
    while time.time() < deadline and not killed:
        if partial.exists() and any(partial.iterdir()):
            time.sleep(1.0)  # a few rounds into the run
            for pid in _task_pids():
                os.kill(pid, 9)
                killed.append(pid)
        time.sleep(0.1)
    worker.join(timeout=300)
    assert killed, "the task's worker was never seen running"
    torch.set_num_threads(1)  # as the Ray worker trains
    uninterrupted = ff.run(cfg, progress=False)
    assert out["h"][0].same_as(uninterrupted)


def test_no_cluster_at_the_address_is_one_clear_line(tmp_path):
    from fedfrozen.flower.launch import _free_ports

    (port,) = _free_ports(1)
    script = ("import fedfrozen as ff; from conftest import tiny_config; "
              "ff.run_many([tiny_config()], root=r'%s', progress=False)" % tmp_path)
    env = {**os.environ, cluster.ADDRESS_ENV: f"127.0.0.1:{port}"}
    done = subprocess.run([sys.executable, "-c", script], cwd=os.path.dirname(__file__), env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ConnectionError: no Ray cluster at '127.0.0.1:") and "ray start --head" in last


def test_ray_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"fedfrozen\[cluster\]"):
        cluster.ray_module()


def test_a_bad_gpu_share_is_named_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv(cluster.GPUS_ENV, "half")
    with pytest.raises(ValueError, match="FEDFROZEN_RAY_GPUS must be a number > 0"):
        ff.run_many(smoke_cfgs()[:1], root=tmp_path, backend="ray", progress=False)
