"""Runs inside the one Soft-RoCE VM of tests/test_softroce.py: the doctor's
cases (guest_doctor.py) and the verbs suite (guest_suite.py) in one boot.

    python -m tests.softroce.guest_one_vm DOCTOR_DIR REPORT.json [phases...]

The doctor imports no torch, so it runs in a process of its own while this
one spends its minutes on `import torch` (the second vCPU is idle then): the
doctor costs the suite next to no time. It must be gone before the suite
takes its baseline of the machine's verbs objects (`rdma res show`), since
the doctor opens rxe0 itself; it is waited for, and stopped after
DOCTOR_LIMIT_S. Its exit status, and how long the suite waited for it, go to
DOCTOR_DIR/process.json.
"""
import json
import os
import signal
import subprocess
import sys
import time

# Five Python start-ups and doctor runs take well under a minute beside the
# import; this only bounds a hang (which the doctor test then reports).
DOCTOR_LIMIT_S = 300


def main():
    doctor_dir, suite_args = sys.argv[1], sys.argv[2:]
    os.makedirs(doctor_dir, exist_ok=True)
    t0 = time.time()
    with open(os.path.join(doctor_dir, "log"), "w") as log:
        doctor = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "guest_doctor.py"),
                                   doctor_dir], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    from tests.softroce import guest_suite  # imports torch: minutes under emulation

    t_import = time.time()
    try:
        rc = doctor.wait(timeout=max(1.0, DOCTOR_LIMIT_S - (t_import - t0)))
    except subprocess.TimeoutExpired:
        os.killpg(doctor.pid, signal.SIGKILL)  # its doctor runs too, which hold rxe0
        rc = doctor.wait()
    t_doctor = time.time()
    info = {"exit_code": rc, "import_torch_s": round(t_import - t0, 1), "waited_after_import_s": round(t_doctor - t_import, 1)}
    with open(os.path.join(doctor_dir, "process.json"), "w") as f:
        json.dump(info, f)
    print(f"[guest] doctor: {info}", flush=True)
    guest_suite.main(suite_args)


if __name__ == "__main__":
    main()
