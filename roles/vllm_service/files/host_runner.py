# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""What nvidia_smi.NvidiaSmi needs of an AnsibleModule, on plain subprocess: for the host programs the service
role installs next to this file and nvidia_smi.py (vllm-gpu-idle, inferops-vllm-watchdog)."""
from __future__ import annotations

import os
import shutil
import subprocess


class SubprocessRunner(object):
    """The two AnsibleModule methods ``NvidiaSmi`` uses, on plain subprocess: for the host programs the
    service role installs next to this file (vllm-gpu-idle, inferops-vllm-watchdog)."""

    def __init__(self, timeout=120):
        self.timeout = timeout

    def run_command(self, cmd, environ_update=None):
        env = dict(os.environ)
        # a unit's pinning must not narrow what nvidia-smi shows
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(environ_update or {})
        try:
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=self.timeout, check=False)
        except OSError as exc:
            return 127, "", str(exc)
        except subprocess.TimeoutExpired:
            return 124, "", "timed out after %s s" % self.timeout
        return proc.returncode, proc.stdout, proc.stderr

    def get_bin_path(self, name, required=False, opt_dirs=None):
        found = shutil.which(name)
        if found:
            return found
        for directory in opt_dirs or []:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None
