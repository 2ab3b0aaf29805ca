# Apache License 2.0 (see LICENSE)
"""Drive gpu_facts and gpu_footprint through ``ansible -c local`` on a real GPU (see device_check.sh).

Stages (GPU ``--gpu``, ``--gib`` GiB held by tests/gpu/hold_gpu_memory.py):
  1. capture every nvidia-smi command form module_utils/nvidia_smi.py uses (idle)
  2. gpu_facts (idle); gpu_footprint with expected: [] must pass (else the GPU is not free: abort)
  3. start the holder with a delay; gpu_footprint with the right expectation and wait_timeout must
     pass after polling
  4. capture again (busy); gpu_facts (busy) must list the holder's memory
  5. gpu_footprint: right amount (also in check mode and as used_fraction) must pass; a wrong
     amount, an idle expectation, a unit owner, an unknown GPU and a missing nvidia-smi must fail
     with the right message
  6. stop the holder; gpu_footprint expected: [] (with wait) must pass again
Writes to --out: results.json (every module result, timing and check), summary.md, and
captures.tar.gz (the nvidia-smi outputs in the tests/fixtures/nvidia-smi layout).
Exit 0 when every hard check holds, 1 when one does not, 3 when the GPU is busy at the start.
"""
import argparse
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "plugins", "module_utils"))

import nvidia_smi as smi_lib  # noqa: E402  pylint: disable=wrong-import-position,import-error

UNIT = "vllm-devcheck.service"
SMI_ENV = dict(os.environ, **smi_lib.NVIDIA_SMI_ENV)


def minimal_result(stdout):
    """(status, result) from the minimal callback's ``localhost | STATUS => {json}``, or (None, None)."""
    for match in re.finditer(r"^localhost \| ([A-Z!]+)(?: \| rc=-?[0-9]+)? => ", stdout, re.M):
        try:
            result, _end = json.JSONDecoder().raw_decode(stdout[match.end():])
        except ValueError:
            continue
        if isinstance(result, dict):
            return match.group(1), result
    return None, None


def find_smi():
    """nvidia-smi as the modules find it: PATH, then the driver directories they also search."""
    found = shutil.which("nvidia-smi")
    for directory in [] if found else smi_lib.NVIDIA_SMI_DIRS:
        path = os.path.join(directory, "nvidia-smi")
        if os.access(path, os.X_OK):
            return path
    return found or "nvidia-smi"


class DeviceCheck(object):
    def __init__(self, args):
        self.args = args
        self.gpu = args.gpu
        self.mib = int(args.gib * 1024)
        self.smi = args.nvidia_smi or find_smi()
        self.calls = []        # module calls
        self.checks = []       # (name, hard, ok, detail)
        self.captures = []     # (file name, rc, command, seconds)
        self.capture_files = {}
        self.holder = None
        self.holder_lines = []
        self.holder_ready = threading.Event()
        self.notes = {}
        os.makedirs(os.path.join(args.work, "args"), exist_ok=True)

    # ---------------------------------------------------------------- helpers
    def check(self, name, ok, detail="", hard=True):
        ok = bool(ok)
        self.checks.append({"name": name, "hard": hard, "ok": ok, "detail": detail})
        verdict = "PASS" if ok else ("FAIL" if hard else "WARN")
        print("   %s %s%s%s" % (verdict, name, "" if hard else " (soft)", (": " + detail) if detail and not ok else ""))
        return ok

    def capture(self, stage, name, args):
        cmd = [self.smi] + list(args)
        start = time.monotonic()
        proc = subprocess.run(cmd, env=SMI_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, check=False)
        seconds = time.monotonic() - start
        fname = "%s_%s.out" % (stage, name)
        self.capture_files[fname] = proc.stdout + proc.stderr
        self.captures.append((fname, proc.returncode, " ".join(["nvidia-smi"] + list(args)), seconds))
        return proc.returncode, proc.stdout

    def capture_all(self, stage, full=True):
        fields = list(smi_lib.GPU_FIELDS)
        no_reserved = [f for f in fields if f != "memory.reserved"]
        forms = [
            ("query", smi_lib.QUERY_GPU_ARGS),
            ("apps", smi_lib.QUERY_APPS_ARGS),
        ]
        if full:
            forms += [
                ("query_nhnu", ("--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits")),
                ("query_no_reserved", ("--query-gpu=" + ",".join(no_reserved), "--format=csv")),
                ("apps_nhnu", (smi_lib.QUERY_APPS_ARGS[0], "--format=csv,noheader,nounits")),
                ("topo", smi_lib.TOPO_ARGS),
                ("version", smi_lib.VERSION_ARGS),
                ("smi", smi_lib.PLAIN_ARGS),
                ("bad_field", ("--query-gpu=index,bogus.field", "--format=csv")),
            ]
        results = {}
        for name, args in forms:
            results[name] = self.capture(stage, name, args)
        return results

    def ansible(self, name, module, margs, expect, check_mode=False, musts=()):
        """Run one module through ansible ad hoc; record result and timing; check pass/fail."""
        varsfile = os.path.join(self.args.work, "args", name + ".json")
        if self.args.nvidia_smi:
            margs = dict(margs)
            margs.setdefault("nvidia_smi", self.args.nvidia_smi)
        with open(varsfile, "w") as handle:
            json.dump({"devcheck_args": margs}, handle)
        kv = " ".join("%s={{ devcheck_args.%s }}" % (k, k) for k in margs)
        cmd = [self.args.ansible, "localhost", "-i", "localhost,", "-c", "local",
               "-m", "inferops.vllm.%s" % module, "-e", "@" + varsfile,
               "-e", "ansible_python_interpreter=%s" % self.args.python]
        if kv:
            cmd += ["-a", kv]
        if check_mode:
            cmd.append("--check")
        env = dict(os.environ)
        env.update({
            "ANSIBLE_COLLECTIONS_PATH": os.path.join(self.args.work, "collections"),
            "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
            "ANSIBLE_HOME": os.path.join(self.args.work, "ansible-home"),
            "ANSIBLE_LOCAL_TEMP": os.path.join(self.args.work, "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
        })
        start = time.monotonic()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, check=False)
        seconds = round(time.monotonic() - start, 3)
        status, result = minimal_result(proc.stdout)
        failed = status not in ("SUCCESS", "CHANGED") or proc.returncode != 0
        call = {"name": name, "module": module, "args": margs, "check_mode": check_mode, "status": status,
                "expect": expect, "outcome": "fail" if failed else "pass", "rc": proc.returncode,
                "seconds": seconds, "result": result,
                "stderr": proc.stderr[-4000:], "stdout_tail": None if result else proc.stdout[-4000:]}
        self.calls.append(call)
        msg = (result or {}).get("msg", "") or ""
        print("== %s (%s, expect %s): %s in %.2f s%s" % (
            name, module, expect, call["outcome"], seconds, ("\n   msg: " + msg) if msg else ""))
        if result is None:
            print(proc.stdout[-2000:], proc.stderr[-2000:])
        self.check("%s: %s as expected" % (name, "passes" if expect == "pass" else "fails"),
                   call["outcome"] == expect, "outcome %s, msg %r" % (call["outcome"], msg[:500]))
        for part in musts:
            self.check("%s: message names %r" % (name, part), part in msg, "msg %r" % msg[:800])
        return result or {}

    def start_holder(self, delay):
        info = os.path.join(self.args.work, "holder.json")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(self.gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        if self.args.simulate_holder:
            cmd = ["sh", "-c", "sleep %s; exec %s --mib %d" % (delay, self.args.simulate_holder, self.mib + 600)]
        else:
            cmd = [self.args.python, os.path.join(HERE, "hold_gpu_memory.py"), "--gib", str(self.args.gib),
                   "--gpus", str(self.gpu), "--delay", str(delay), "--info", info]
        print("== holder: %s" % " ".join(cmd))
        self.holder = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       universal_newlines=True)

        def reader():
            for line in self.holder.stdout:
                self.holder_lines.append(line.rstrip("\n"))
                if line.strip() == "ready":
                    self.holder_ready.set()
        threading.Thread(target=reader, daemon=True).start()
        return info

    def stop_holder(self):
        if self.holder and self.holder.poll() is None:
            self.holder.send_signal(signal.SIGTERM)
            try:
                self.holder.wait(30)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()

    # ---------------------------------------------------------------- stages
    def run(self):
        gpu, mib = self.gpu, self.mib
        print("== capture (idle)")
        idle = self.capture_all("idle")
        version = smi_lib.parse_version(idle["version"][1]) if idle["version"][0] == 0 else \
            smi_lib.parse_version(idle["smi"][1])
        self.notes["versions"] = version

        facts = self.ansible("facts_idle", "gpu_facts", {}, "pass").get("ansible_facts", {})
        gpus = facts.get("gpus", [])
        self.check("facts_idle: GPUs found", bool(gpus))
        mine = [g for g in gpus if g.get("index") == gpu]
        if not self.check("facts_idle: GPU %d exists" % gpu, bool(mine)):
            return
        mine = mine[0]
        self.check("facts_idle: driver version as nvidia-smi --version says",
                   facts.get("gpu_driver", {}).get("driver_version") == version["driver_version"],
                   "%r vs %r" % (facts.get("gpu_driver"), version))
        self.check("facts_idle: CUDA version as nvidia-smi says",
                   facts.get("gpu_driver", {}).get("cuda_version") == version["cuda_version"],
                   "%r vs %r" % (facts.get("gpu_driver"), version))
        self.check("facts_idle: contract keys", set(mine) == {
            "index", "uuid", "name", "pci_bus_id", "memory_total_mib", "memory_used_mib", "memory_free_mib",
            "memory_reserved_mib", "mig_mode", "numa_node", "cpu_affinity", "compute_mode"}, sorted(mine))
        calls = self.calls[-1]["result"].get("nvidia_smi_calls", [])
        self.check("facts_idle: at most 5 nvidia-smi calls", 0 < len(calls) <= 5, json.dumps(calls))
        self.check("facts_idle: exactly 4 nvidia-smi calls (--version known)", len(calls) == 4,
                   json.dumps(calls), hard=False)
        self.notes["sysfs"] = {}
        for g in gpus:
            self.notes["sysfs"][g["pci_bus_id"]] = {
                "numa_node": smi_lib.sysfs_numa_node(g["pci_bus_id"]),
                "local_cpulist_cpus": len(smi_lib.sysfs_local_cpulist(g["pci_bus_id"])),
                "facts_numa_node": g["numa_node"], "facts_cpus": len(g["cpu_affinity"])}

        self.ansible("footprint_idle_start", "gpu_footprint", {"expected": []}, "pass")
        if self.calls[-1]["outcome"] != "pass":
            print("GPU is not idle at the start: the checks below would be meaningless; stopping.")
            return 3

        expected = [{"name": "holder", "gpus": [gpu], "used_mib": mib}]
        self.start_holder(delay=self.args.delay)
        waited = self.ansible("footprint_wait_for_load", "gpu_footprint",
                              {"expected": expected, "wait_timeout": 180, "poll_interval": 2}, "pass")
        self.check("footprint_wait_for_load: polled more than once", waited.get("polls", 0) >= 2,
                   "polls %r" % waited.get("polls"), hard=False)
        if not self.check("holder ready", self.holder_ready.wait(120), "\n".join(self.holder_lines[-20:])):
            return
        info = os.path.join(self.args.work, "holder.json")
        if os.path.exists(info):
            with open(info) as handle:
                self.notes["holder"] = json.load(handle)
        self.notes["holder_pid"] = self.holder.pid
        with open("/proc/%d/cgroup" % self.holder.pid) as handle:
            self.capture_files["busy_holder_cgroup.txt"] = handle.read()

        print("== capture (busy)")
        self.capture_all("busy")
        facts = self.ansible("facts_busy", "gpu_facts", {}, "pass").get("ansible_facts", {})
        busy = [g for g in facts.get("gpus", []) if g.get("index") == gpu]
        used = busy[0]["memory_used_mib"] if busy else None
        self.check("facts_busy: memory used >= held", used is not None and used >= mib, "used %r" % used)
        procs = [p for p in facts.get("gpu_processes", []) if p.get("gpu_index") == gpu and (p.get("used_mib") or 0) >= mib]
        self.check("facts_busy: the holder is listed with its memory", bool(procs), json.dumps(facts.get("gpu_processes")))
        pid = procs[0]["pid"] if procs else self.holder.pid
        self.check("facts_busy: nvidia-smi pid is the holder's pid", pid == self.holder.pid,
                   "%r vs %r" % (pid, self.holder.pid), hard=False)
        if busy:
            self.notes["context_overhead_mib"] = used - mib
            holder = self.notes.get("holder", {}).get("gpus", {}).get(str(gpu))
            if holder and busy[0]["memory_reserved_mib"] is not None:
                cuda_total = holder["cuda_total_mib"]
                smi_usable = busy[0]["memory_total_mib"] - busy[0]["memory_reserved_mib"]
                self.notes["cuda_total_vs_total_minus_reserved"] = [cuda_total, smi_usable]
                self.check("CUDA's total is memory.total - memory.reserved (used_fraction base)",
                           abs(cuda_total - smi_usable) <= 2, "%r vs %r" % (cuda_total, smi_usable), hard=False)

        self.ansible("footprint_right", "gpu_footprint", {"expected": expected}, "pass")
        self.ansible("footprint_right_check_mode", "gpu_footprint", {"expected": expected}, "pass", check_mode=True)
        if busy and busy[0]["memory_reserved_mib"] is not None:
            fraction = round(float(used) / (busy[0]["memory_total_mib"] - busy[0]["memory_reserved_mib"]), 4)
            self.ansible("footprint_fraction", "gpu_footprint",
                         {"expected": [{"name": "holder", "gpus": [mine["uuid"]], "used_fraction": fraction}]}, "pass")
        wrong = 2 * mib
        self.ansible("footprint_wrong_amount", "gpu_footprint",
                     {"expected": [{"name": "holder", "gpus": [gpu], "used_mib": wrong}]}, "fail",
                     musts=["GPU %d (%s) of 'holder': uses %d MiB, below the expected %d-%d MiB (%d +/- 1024)"
                            % (gpu, mine["uuid"], used or -1, wrong - 1024, wrong + 1024, wrong),
                            "held by pid %d (" % pid])
        self.ansible("footprint_idle_expected", "gpu_footprint", {"expected": []}, "fail",
                     musts=["GPU %d (%s) should be idle: uses %d MiB, more than the idle limit of 256 MiB"
                            % (gpu, mine["uuid"], used or -1), "held by pid %d (" % pid])
        self.ansible("footprint_wrong_owner", "gpu_footprint",
                     {"expected": [{"name": "holder", "gpus": [gpu], "used_mib": mib, "unit": UNIT}]}, "fail",
                     musts=["memory held by processes outside %s: pid %d (" % (UNIT, pid)])
        self.ansible("footprint_unknown_gpu", "gpu_footprint",
                     {"expected": [{"name": "holder", "gpus": [99], "used_mib": mib}]}, "fail",
                     musts=["expected[0] (holder) names GPU 99, which this host does not have"])
        saved = self.args.nvidia_smi
        self.args.nvidia_smi = "/nonexistent/nvidia-smi"
        self.ansible("footprint_missing_nvidia_smi", "gpu_footprint", {"expected": []}, "fail",
                     musts=["nvidia-smi not found at /nonexistent/nvidia-smi"])
        self.args.nvidia_smi = saved

        print("== stop holder")
        self.stop_holder()
        self.ansible("footprint_idle_after_release", "gpu_footprint",
                     {"expected": [], "wait_timeout": 60, "poll_interval": 2}, "pass")
        self.capture_all("after", full=False)
        return None

    # ---------------------------------------------------------------- output
    def write(self, code):
        out = self.args.out
        hard_failed = [c for c in self.checks if c["hard"] and not c["ok"]]
        with open(os.path.join(out, "results.json"), "w") as handle:
            json.dump({"exit": code, "gpu": self.gpu, "held_mib": self.mib, "notes": self.notes,
                       "checks": self.checks, "module_calls": self.calls,
                       "captures": [{"file": f, "rc": rc, "command": c, "seconds": round(s, 3)}
                                    for f, rc, c, s in self.captures]}, handle, indent=1)
        lines = ["# gpu_facts / gpu_footprint on a real GPU", "",
                 "exit %s; %d checks, %d hard failures, %d soft warnings" % (
                     code, len(self.checks), len(hard_failed),
                     len([c for c in self.checks if not c["hard"] and not c["ok"]])), "",
                 "## Module calls (ansible localhost -c local)", "",
                 "| call | expect | outcome | wall s | nvidia-smi calls (s each) |", "|---|---|---|---|---|"]
        for call in self.calls:
            inner = (call["result"] or {}).get("nvidia_smi_calls", [])
            lines.append("| %s | %s | %s | %.2f | %d (%s) |" % (
                call["name"], call["expect"], call["outcome"], call["seconds"], len(inner),
                ", ".join("%.3f" % c["seconds"] for c in inner)))
        lines += ["", "## Messages", ""]
        for call in self.calls:
            msg = (call["result"] or {}).get("msg")
            if msg:
                lines += ["- %s: `%s`" % (call["name"], msg.replace("`", "'"))]
        lines += ["", "## Checks", ""]
        for c in self.checks:
            lines.append("- %s %s%s" % ("PASS" if c["ok"] else ("FAIL" if c["hard"] else "WARN"), c["name"],
                                        "" if c["ok"] else ": " + c["detail"][:600]))
        lines += ["", "## nvidia-smi calls made directly (captures)", "", "| file | rc | s |", "|---|---|---|"]
        lines += ["| %s | %s | %.3f |" % (f, rc, s) for f, rc, _c, s in self.captures]
        lines += ["", "## Notes", "", "```json", json.dumps(self.notes, indent=1)[:6000], "```", ""]
        with open(os.path.join(out, "summary.md"), "w") as handle:
            handle.write("\n".join(lines))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            def add(name, text):
                data = text.encode()
                member = tarfile.TarInfo("nvidia-smi-devcheck/" + name)
                member.size = len(data)
                member.mtime = int(time.time())
                tar.addfile(member, io.BytesIO(data))
            tsv = ["name\texit_code\tcommand"] + ["%s\t%s\t%s" % (f, rc, c) for f, rc, c, _s in self.captures]
            add("commands.tsv", "\n".join(tsv) + "\n")
            add("timings.tsv", "name\tseconds\n" + "".join("%s\t%.3f\n" % (f, s) for f, _rc, _c, s in self.captures))
            for name, text in sorted(self.capture_files.items()):
                add(name, text)
            add("notes.json", json.dumps(self.notes, indent=1) + "\n")
        with open(os.path.join(out, "captures.tar.gz"), "wb") as handle:
            handle.write(buf.getvalue())
        return 1 if hard_failed and code == 0 else code


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--ansible", required=True, help="ansible binary (ansible-core 2.21)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the modules and the holder")
    parser.add_argument("--work", required=True, help="scratch dir with collections/ansible_collections/inferops/vllm")
    parser.add_argument("--out", required=True)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--gib", type=float, default=20)
    parser.add_argument("--delay", type=float, default=6, help="seconds before the holder allocates")
    parser.add_argument("--nvidia-smi", help="nvidia-smi path for the modules (default: found on PATH)")
    parser.add_argument("--simulate-holder", help="dry run: a gpusim-hold binary instead of torch")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    check = DeviceCheck(args)
    code = 0
    try:
        code = check.run() or 0
    except Exception as exc:  # pylint: disable=broad-except
        import traceback  # pylint: disable=import-outside-toplevel
        traceback.print_exc()
        check.check("device check ran to the end", False, repr(exc))
    finally:
        check.stop_holder()
    code = check.write(code)
    print("== %d checks, exit %d (details in summary.md / results.json)" % (len(check.checks), code))
    return code


if __name__ == "__main__":
    sys.exit(main())
