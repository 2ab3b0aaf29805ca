# Apache License 2.0 (see LICENSE)
"""Filters of the front door: ``vllm_frontdoor_servers`` (the servers of HAProxy's ``show stat`` output and their
states) and ``vllm_frontdoor_key_problems`` (the client keys' problems).

The logic lives in ``plugins/plugin_utils/frontdoor.py`` (``server_states``) and ``plugins/plugin_utils/edge.py``
(``key_problems``).
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.plugin_utils.edge import key_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.frontdoor import server_states
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain


def vllm_frontdoor_servers(show_stat):
    """{"<backend>/<server>": {backend, server, status, check_status, sessions_total}}; see vllm_frontdoor_servers.yml."""
    try:
        return server_states(show_stat)
    except (ValueError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"vllm_frontdoor_servers: {exc}") from exc


def vllm_frontdoor_key_problems(keys, models, instance_key="", allow_unauthenticated=False,
                                where="vllm_frontdoor_api_keys"):
    """Problems of vllm_frontdoor_api_keys (sentences naming models and client names, never a key); see the .yml."""
    return key_problems(plain(keys), where, plain(models), plain(instance_key), bool(allow_unauthenticated))


class FilterModule:
    """Front door runtime state."""

    def filters(self):
        return {"vllm_frontdoor_servers": vllm_frontdoor_servers,
                "vllm_frontdoor_key_problems": vllm_frontdoor_key_problems}
