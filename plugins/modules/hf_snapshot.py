#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_snapshot
short_description: Download a pinned Hugging Face model snapshot, verified, resumable and disk-checked
version_added: 1.0.0
description:
  - Downloads the files of one model repository at one commit into O(dest) with C(huggingface_hub),
    on the target host. Run it with an interpreter that has C(huggingface_hub) (for example a tools
    venv, through C(ansible_python_interpreter)); the module fails naming the interpreter otherwise.
  - Before downloading, checks the free space at O(dest) against the bytes still missing (from the
    Hub's file metadata) plus O(disk_margin_mib) and fails with both numbers when they do not fit.
  - Removes the C(.incomplete) and C(.lock) files that killed runs leave under
    C(<dest>/.cache/huggingface/download/) (C(huggingface_hub) never resumes them across processes).
    Partial files of the parallel-range path (C(<dest>/.cache/inferops/partial/)) are kept and resumed.
  - From an O(endpoint) other than the Hub that serves files with byte ranges (the collection's
    fan-out mirror, the test Hub, plain HTTP mirrors), large files are fetched with
    O(range_connections) parallel C(Range) requests into a preallocated partial file, hashed in the
    same pass (no second read), resumed per chunk by a later run, and renamed into place only when
    complete and verified. An endpoint that does not announce or honour ranges, or redirects, is
    served through C(huggingface_hub) as before; so is the Hub itself (Xet, see O(xet_environment)).
  - Verifies every file against the Hub's metadata - size always; with O(verify=sha256) the sha256
    of LFS files and the git blob sha1 of the other files, hashed in parallel. A file that fails is
    downloaded again once; if it fails again the task fails naming it.
  - Checks completeness against C(model.safetensors.index.json) (every shard it names is selected and present).
  - Records what it verified in C(<dest>/.inferops-verified.json) (the commit's file listing plus
    size, mtime, ctime and inode of every verified file). A re-run for the same pinned commit whose
    files are unchanged makes no network request and hashes nothing. A file changed in any way, even
    with its size and mtime put back, has a new ctime and is verified again.
  - Reports C(changed) only when it wrote model files, removed stale partial downloads or changed ownership.
  - In check mode reports what would be downloaded (count and bytes) without writing anything.
  - The token is passed to the library in memory only; it is never written to disk, returned or put
    on a command line. Telemetry is disabled.
author: inferops maintainers (@inferops)
options:
  repo_id:
    description: Repository on the Hub, C(<org>/<name>).
    type: str
    required: true
  revision:
    description:
      - A 40-hex commit sha.
      - A branch or tag only with O(allow_unpinned=true); it is then resolved and the sha returned as RV(sha).
    type: str
    required: true
  allow_unpinned:
    description: Accept a branch or tag in O(revision).
    type: bool
    default: false
  dest:
    description:
      - Directory that receives the files, usually C(<models_dir>/<org>/<name>/<sha>).
      - Created when missing. Holds C(.inferops-verified.json) and C(.cache/) for bookkeeping.
    type: path
    required: true
  allow_patterns:
    description:
      - Only files matching one of these patterns (fnmatch, C(*) crosses C(/), as C(huggingface_hub) does) are fetched.
      - The default takes weights, configs, tokenizers and chat templates; add C("*.py") for models that need remote code.
      - Use C(["*"]) for everything.
    type: list
    elements: str
    default: ["*.safetensors", "*.json", "tokenizer*", "*.model", "*.tiktoken", "*.jinja", "*.txt"]
  ignore_patterns:
    description:
      - Files matching one of these patterns are skipped.
      - The default skips Meta's C(original/) checkpoints and Mistral's C(consolidated*.safetensors),
        which duplicate the Hugging Face format shards. Set C([]) to keep them.
    type: list
    elements: str
    default: ["original/*", "consolidated*.safetensors"]
  endpoint:
    description: Hub or mirror URL. Default is the library's (C(HF_ENDPOINT) or https://huggingface.co).
    type: str
  token:
    description:
      - Hub token for private or gated repositories. Without a token (and without O(token_file)) no
        token is sent, even if the host has one in C(HF_TOKEN) or a token file.
      - Mutually exclusive with O(token_file).
    type: str
  token_file:
    description:
      - Path on the target to a file holding the token, either alone or as an C(HF_TOKEN=) line
        (the service's C(EnvironmentFile) works). Keeps the token out of the module arguments.
    type: path
  verify:
    description:
      - C(size) checks every file's size against the Hub.
      - C(sha256) also hashes LFS files (sha256) and small files (git blob sha1), in parallel.
        Each file is hashed once; later runs trust the recorded stat until the file changes.
    type: str
    choices: [size, sha256]
    default: size
  expect_tree_digest:
    description:
      - The RV(tree_digest) that the snapshot's listing must have (sha256 of the selected files' sizes, git oids and
        LFS sha256s). The fan-out hands on the digest the tree's root got, so a host copying from a mirror refuses
        any other listing, before it writes anything (a directory it created is removed again).
      - Implies O(verify=sha256) for the files it fetches and checks (the listing is only worth its digest if
        every file is checked against it).
    type: str
  reverify:
    description: Hash (with O(verify=sha256)) or size-check every file again, ignoring the recorded state.
    type: bool
    default: false
  max_workers:
    description:
      - Files downloaded in parallel. C(0) means the number of CPUs, at most 8.
      - Plain HTTP downloads through C(huggingface_hub) cost about one CPU core per 200-250 MiB/s
        (measured on loopback), so more workers than cores only add contention; over a WAN, or with
        many cores, more parallel files help.
    type: int
    default: 0
  range_connections:
    description:
      - Parallel C(Range) requests per file from an endpoint that accepts them (not the Hub, which
        serves through Xet). C(0) never uses ranges (always C(huggingface_hub)).
      - Each connection holds a 1 MiB read buffer; the whole file is hashed by one more thread.
    type: int
    default: 4
  range_chunk_mib:
    description:
      - Size of one range request, in MiB; also the unit in which an interrupted file resumes.
      - The hasher follows the file at most about O(range_connections) x O(range_chunk_mib) behind the
        fastest connection, in the page cache.
    type: int
    default: 32
  xet_environment:
    description:
      - C(HF_XET_*) environment variables set in the module's process before C(huggingface_hub) and
        C(hf_xet) start, for downloads from the Hub through Xet (for example
        C(HF_XET_HIGH_PERFORMANCE=1)). Other names are refused.
    type: dict
    default: {}
  hash_workers:
    description: Threads for hashing files already on disk. C(0) means the number of CPUs, at most 8.
    type: int
    default: 0
  retries:
    description:
      - Retries of a failed metadata call or file download, with exponential backoff (O(retry_backoff), doubled each time, at most 60 s).
      - Never retried - repository not found, gated repository, revision not found, file not found,
        rejected token, full disk.
    type: int
    default: 5
  retry_backoff:
    description: Seconds before the first retry.
    type: float
    default: 2.0
  timeout:
    description: Seconds to wait for the Hub's answer to a metadata request.
    type: float
    default: 10
  disk_margin_mib:
    description: Free space that must remain at O(dest) after the download, in MiB.
    type: int
    default: 1024
  lock_timeout:
    description: Seconds to wait for another run on the same O(dest) to finish.
    type: int
    default: 600
  progress_file:
    description:
      - File rewritten about once a second with progress as JSON (phase, bytes done and total, rate,
        ETA, files, and a one-line C(summary)) for a poller of an async task. Holds no secret.
    type: path
  owner:
    description: Owner (name or uid) given to O(dest) and everything below it.
    type: str
  group:
    description: Group (name or gid) given to O(dest) and everything below it.
    type: str
notes:
  - Check mode is supported; it may contact the Hub and hash files, but writes nothing.
  - With C(async), Ansible stages the module with its arguments in the remote temporary directory for
    the duration of the task; prefer O(token_file) there, or pipelining for synchronous runs.
requirements:
  - huggingface_hub (tested with 2.4.0) on the target's Python interpreter
"""

EXAMPLES = r"""
- name: Fetch a pinned snapshot, sha256-verified
  inferops.vllm.hf_snapshot:
    repo_id: Qwen/Qwen3-0.6B
    revision: c1899de289a04d12100db370d81485cdf75e47ca
    dest: /var/lib/inferops/models/Qwen/Qwen3-0.6B/c1899de289a04d12100db370d81485cdf75e47ca
    verify: sha256
    owner: vllm
    group: vllm
  vars:
    ansible_python_interpreter: /opt/inferops/tools/bin/python

- name: Long download as an async job, progress in a file the play can poll
  inferops.vllm.hf_snapshot:
    repo_id: "{{ model.repo_id }}"
    revision: "{{ model.revision }}"
    dest: "{{ model_dir }}"
    token_file: /etc/inferops/hf-token.env
    progress_file: /run/inferops/hf_snapshot-{{ model.name }}.json
  async: 86400
  poll: 0
  register: fetch_job

- name: What would be fetched from a branch (check mode)
  inferops.vllm.hf_snapshot:
    repo_id: acme/tiny-llama
    revision: main
    allow_unpinned: true
    dest: /srv/models/acme/tiny-llama/next
  check_mode: true
"""

RETURN = r"""
sha:
  description: Commit sha of the snapshot (the resolved one when O(revision) is a branch or tag).
  returned: always
  type: str
  sample: c1899de289a04d12100db370d81485cdf75e47ca
revision:
  description: The revision as given.
  returned: always
  type: str
  sample: main
resolved:
  description: Whether O(revision) was a branch or tag that was resolved to RV(sha).
  returned: always
  type: bool
  sample: false
dest:
  description: Absolute destination directory.
  returned: always
  type: str
  sample: /var/lib/inferops/models/acme/tiny/c1899de289a04d12100db370d81485cdf75e47ca
files:
  description: Number of files selected by the patterns.
  returned: always
  type: int
  sample: 12
total_bytes:
  description: Size of the selected files.
  returned: always
  type: int
  sample: 3286123
downloaded_files:
  description: Files downloaded by this run (a re-downloaded file counts once per download).
  returned: always
  type: int
  sample: 4
bytes_downloaded:
  description: Bytes of the files downloaded by this run.
  returned: always
  type: int
  sample: 3280000
downloaded:
  description: Paths downloaded by this run.
  returned: always
  type: list
  elements: str
  sample: [model-00001-of-00004.safetensors]
repaired:
  description: Paths that were present but wrong (size or hash) and were downloaded again.
  returned: always
  type: list
  elements: str
  sample: [model-00002-of-00004.safetensors]
would_download:
  description: In check mode, what a real run would fetch.
  returned: check mode
  type: dict
  sample: {files: 2, bytes: 2097152, paths: [model-00001-of-00004.safetensors, config.json]}
seconds:
  description: Wall time of the module.
  returned: always
  type: float
  sample: 12.5
download_seconds:
  description: Wall time of the download phase.
  returned: success
  type: float
  sample: 11.9
throughput_mib_s:
  description: RV(bytes_downloaded) over RV(download_seconds), in MiB/s.
  returned: always
  type: float
  sample: 812.4
verification:
  description:
    - Verification summary. C(mode) size or sha256; C(files) checked in all; C(trusted) unchanged since
      an earlier verification (not re-read); C(content_checked) and C(bytes_hashed) by this run;
      C(mismatches) found (path, reason, expected, actual, phase); C(result) ok.
  returned: always
  type: dict
  sample: {mode: sha256, files: 12, trusted: 0, content_checked: 12, bytes_hashed: 3286123, hash_seconds: 0.01, mismatches: [], result: ok}
completeness:
  description: Weight indexes checked and the number of shards they name.
  returned: success
  type: dict
  sample: {indexes: [model.safetensors.index.json], shards: 4, ok: true}
disk:
  description: The disk check, in bytes (free, missing, margin, need, available).
  returned: always
  type: dict
  sample: {free_bytes: 85899345920, missing_bytes: 3286123, margin_bytes: 1073741824, need_bytes: 1077027947, available_bytes: 85899345920}
stale_removed:
  description: Partial downloads and lock files of earlier runs that were removed (or would be, in check mode).
  returned: always
  type: dict
  sample: {files: 1, bytes: 52428800}
tree_source:
  description: Where the file listing came from - C(manifest) (no network) or C(hub).
  returned: always
  type: str
  sample: manifest
tree_digest:
  description:
    - sha256 of the listing of the selected files (path, size, git oid, LFS sha256), in a canonical form.
    - Also returned (with C(refused=listing)) when O(expect_tree_digest) refuses the listing.
  returned: always
  type: str
  sample: 3b1f0c5e9d7a4c2b8e6f1a0d9c8b7a6f5e4d3c2b1a09f8e7d6c5b4a39281706f
hub_contacted:
  description: Whether the run made any request to the Hub.
  returned: always
  type: bool
  sample: false
transfer:
  description:
    - How the files were fetched. C(method) C(ranges) (parallel ranges, hashed in the same pass),
      C(huggingface_hub), C(mixed) or C(none); C(files_ranged) and C(files_library); C(resumed_bytes)
      (partial files of an earlier run reused); C(range_requests) and C(range_retries); C(fallback)
      (why the library took over, or null); C(xet_environment) (the C(HF_XET_*) variables set).
  returned: success
  type: dict
  sample: {method: ranges, range_connections: 4, range_chunk_bytes: 33554432, files_ranged: 10, files_library: 0,
           resumed_bytes: 0, range_requests: 74, range_retries: 0, fallback: null, xet_environment: {}}
retries:
  description: Transient failures that were retried (what, attempt, delay_s, error).
  returned: success
  type: list
  elements: dict
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.vllm.plugins.module_utils.hf_snapshot import (
    DEFAULT_ALLOW_PATTERNS,
    DEFAULT_IGNORE_PATTERNS,
    SnapshotError,
    run_snapshot,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            allow_unpinned=dict(type="bool", default=False),
            dest=dict(type="path", required=True),
            allow_patterns=dict(type="list", elements="str", default=list(DEFAULT_ALLOW_PATTERNS)),
            ignore_patterns=dict(type="list", elements="str", default=list(DEFAULT_IGNORE_PATTERNS)),
            endpoint=dict(type="str"),
            token=dict(type="str", no_log=True),
            token_file=dict(type="path"),
            verify=dict(type="str", default="size", choices=["size", "sha256"]),
            reverify=dict(type="bool", default=False),
            expect_tree_digest=dict(type="str"),
            max_workers=dict(type="int", default=0),
            hash_workers=dict(type="int", default=0),
            range_connections=dict(type="int", default=4),
            range_chunk_mib=dict(type="int", default=32),
            xet_environment=dict(type="dict", default={}),
            retries=dict(type="int", default=5),
            retry_backoff=dict(type="float", default=2.0),
            timeout=dict(type="float", default=10),
            disk_margin_mib=dict(type="int", default=1024),
            lock_timeout=dict(type="int", default=600),
            progress_file=dict(type="path"),
            owner=dict(type="str"),
            group=dict(type="str"),
        ),
        mutually_exclusive=[("token", "token_file")],
        supports_check_mode=True,
    )
    if module.params["max_workers"] < 0 or module.params["hash_workers"] < 0:
        module.fail_json(msg="max_workers and hash_workers must not be negative")
    if module.params["range_connections"] < 0 or module.params["range_chunk_mib"] < 1:
        module.fail_json(msg="range_connections must not be negative and range_chunk_mib must be at least 1")
    if module.params["retries"] < 0:
        module.fail_json(msg="retries must not be negative")

    def secret(token):
        # A token read from token_file is masked in any output, like a no_log option.
        module.no_log_values.add(token)

    try:
        result = run_snapshot(module.params, check_mode=module.check_mode, warn=module.warn, on_secret=secret)
    except SnapshotError as e:
        module.fail_json(msg=e.msg, **e.fields)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
