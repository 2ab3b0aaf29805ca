"""After converge: the fake servers are gone and every simulated GPU reads idle again."""


def test_all_gpus_idle_after_converge(host):
    out = host.check_output("nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
    used = [int(line.split(",")[1]) for line in out.splitlines()]
    assert len(used) == 8 and max(used) < 256, used


def test_no_compute_apps_left(host):
    out = host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader")
    assert out.strip() == "" or "No running processes found" in out, out
