"""Helper of scripts/gpu_check.sh; standard library only.

    gpu_check_report.py env WORK          facts about the machine: printed, and WORK/env.json
    gpu_check_report.py report WORK OUT   OUT/results.json and OUT/report.md from what the steps left in WORK

WORK holds steps.tsv (one line per step: name, status, start, end, cap,
command), each step's output as NAME.out, the benchmarks' JSON files and,
when the run stopped early, a file `stopped` with the reason.
"""
import glob
import json
import os
import re
import subprocess
import sys
import time


def _run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
        return (p.stdout + p.stderr).strip() if p.returncode == 0 else f"(rc {p.returncode}) {p.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(unavailable: {e})"


def _rdma_devices(ibv_text):
    """Device names listed by ibv_devices (the lines after its dashed header),
    else those in /sys/class/infiniband."""
    lines = ibv_text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("---"):
            return [ln.split()[0] for ln in lines[i + 1:] if ln.strip()]
    return sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []


def env(work):
    import ctypes

    facts = {"python": sys.version.split()[0], "nproc": len(os.sched_getaffinity(0)),
             "host": os.uname().nodename, "glibc": _run(["getconf", "GNU_LIBC_VERSION"]),
             "nvidia_smi": _run(["nvidia-smi", "-L"]), "topology": _run(["nvidia-smi", "topo", "-m"]),
             "nvcc": (_run(["nvcc", "--version"]).splitlines() or [""])[-1], "ninja": _run(["ninja", "--version"]),
             "ibv_devices": _run(["ibv_devices"])}
    facts["rdma_devices"] = _rdma_devices(facts["ibv_devices"])
    try:
        ctypes.CDLL("libibverbs.so.1")
        facts["libibverbs"] = "loads"
    except OSError as e:
        facts["libibverbs"] = f"does not load: {e}"
    try:
        import torch

        cuda = torch.cuda.is_available()
        facts.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=cuda,
                     device_count=torch.cuda.device_count() if cuda else 0,
                     devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [])
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        facts.update(torch=f"import failed: {e}", cuda_available=False, device_count=0, devices=[])
    # The probes that need more than one GPU or an RDMA device skip themselves
    # elsewhere; the conditions are recorded so a skip can be read correctly.
    facts["probe_conditions"] = {"multi_gpu": facts["device_count"] >= 2,
                                 "stale_registration": bool(facts["rdma_devices"])}
    for k, v in facts.items():
        print(f"{k}: {v}" if "\n" not in str(v) else f"{k}:\n{v}")
    print(f"summary: {facts['device_count']} CUDA device(s) {facts['devices']}, torch {facts['torch']}, "
          f"{facts['nproc']} CPUs, RDMA devices {facts['rdma_devices']}")
    with open(os.path.join(work, "env.json"), "w") as f:
        json.dump(facts, f, indent=1)


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _note(text):
    """pytest's summary line, else the output's last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)[ ,]|no tests ran", ln):
            return ln.strip("= ")
    return lines[-1][:160] if lines else ""


def report(work, out):
    steps = []
    for line in _read(os.path.join(work, "steps.tsv")).splitlines():
        name, status, t0, t1, cap, cmd = line.split("\t")
        text = _read(os.path.join(work, name + ".out"))
        steps.append({"step": name, "status": status, "seconds": round(float(t1) - float(t0), 1),
                      "cap_s": int(cap), "command": cmd, "note": _note(text) if text else ""})
    envj = json.loads(_read(os.path.join(work, "env.json")) or "{}")
    stopped = _read(os.path.join(work, "stopped")).strip()
    bench = {os.path.basename(p)[:-5]: json.loads(_read(p) or "null") for p in sorted(glob.glob(f"{work}/*.json"))
             if not p.endswith("/env.json")}
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "stopped": stopped or None, "env": envj,
               "steps": steps, "benchmarks": bench}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    md = [f"# GPU check, {results['date']}, {envj.get('host', '?')}", ""]
    if stopped:
        md += [f"**stopped: {stopped}**", ""]
    md += [f"- GPUs: {', '.join(envj.get('devices') or []) or 'none'}; torch {envj.get('torch')} "
           f"(CUDA {envj.get('torch_cuda')}), python {envj.get('python')}, {envj.get('nproc')} CPUs, "
           f"{envj.get('glibc')}",
           f"- RDMA devices: {', '.join(envj.get('rdma_devices') or []) or 'none'}; libibverbs "
           f"{envj.get('libibverbs')}",
           f"- probe conditions: {envj.get('probe_conditions')}", "",
           "| step | status | seconds | cap s | note |", "|---|---|---|---|---|"]
    md += [f"| {s['step']} | {s['status']} | {s['seconds']} | {s['cap_s'] or '-'} | {s['note'].replace('|', '/')} |"
           for s in steps]
    for s in steps:
        text = _read(os.path.join(work, s["step"] + ".out")).rstrip()
        if not text:
            continue
        if s["step"].startswith(("staging", "workers")) and s["status"] == "ok":
            md += ["", f"## {s['step']}: `{s['command']}`", "", "```", text, "```"]
        elif s["step"].startswith("tests") or s["status"] != "ok":
            # Without ninja's command lines, which would fill the tail of a failed build.
            lines = [ln for ln in text.splitlines() if not re.match(r"\[\d+/\d+\] ", ln)]
            tail = "\n".join(lines[-30:])
            md += ["", f"## {s['step']} ({s['status']}): output tail", "", "```", tail, "```"]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["env"] and len(sys.argv) == 3:
        env(sys.argv[2])
    elif sys.argv[1:2] == ["report"] and len(sys.argv) == 4:
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
