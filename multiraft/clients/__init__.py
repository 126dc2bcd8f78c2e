"""The Python client's parts; import from `multiraft.client`."""
