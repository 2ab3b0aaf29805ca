# Apache License 2.0 (see LICENSE)
"""Filter ``vllm_frontdoor_servers``: the servers of HAProxy's ``show stat`` output and their states.

The logic lives in ``plugins/plugin_utils/frontdoor.py`` (``server_states``).
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def vllm_frontdoor_servers(show_stat):
    """{"<backend>/<server>": {backend, server, status, check_status, sessions_total, sessions_current}}; see vllm_frontdoor_servers.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.frontdoor import server_states  # pylint: disable=import-outside-toplevel
    try:
        return server_states(show_stat)
    except (ValueError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"vllm_frontdoor_servers: {exc}") from exc


class FilterModule:
    """Front door runtime state."""

    def filters(self):
        return {"vllm_frontdoor_servers": vllm_frontdoor_servers}
