# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""One poll of an async hf_snapshot job, for the vllm_weights role's progress loop.

usage: python weights_progress.py PROGRESS_FILE ASYNC_RESULTS_FILE

Prints one line of JSON: ``finished`` (the async job's results file holds its final result, or the
job is gone), ``phase`` and ``summary`` (from the module's progress file; a progress file older than
the job is ignored, so a previous run's "done" never ends the loop early). Always exits 0: a missing
or half-written file is a state to report, not an error.
"""
from __future__ import annotations

import json
import os
import sys


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f), os.fstat(f.fileno()).st_mtime
    except (OSError, ValueError):
        return None, None


def poll(progress_file, results_file):
    job, job_mtime = read_json(results_file)
    if job is None and not os.path.exists(results_file):
        finished, job_state = True, "job results file missing"
    elif job is None:
        finished, job_state = False, "running"  # being rewritten right now
    else:
        finished = bool(job.get("finished")) or "started" not in job
        job_state = "finished" if finished else "running"
    progress, _mtime = read_json(progress_file)
    if progress is not None and job_mtime is not None and float(progress.get("updated") or 0) + 1 < job_mtime:
        progress = None  # from an earlier run
    if progress is None:
        phase, summary = "starting", "starting (%s)" % job_state
    else:
        phase, summary = progress.get("phase", "?"), progress.get("summary") or progress.get("phase", "?")
    return {"finished": finished, "job": job_state, "phase": phase, "summary": summary,
            "bytes_done": (progress or {}).get("bytes_done"), "bytes_total": (progress or {}).get("bytes_total"),
            "rate_bytes_per_s": (progress or {}).get("rate_bytes_per_s")}


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: weights_progress.py PROGRESS_FILE ASYNC_RESULTS_FILE\n")
        return 2
    sys.stdout.write(json.dumps(poll(args[0], args[1]), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
