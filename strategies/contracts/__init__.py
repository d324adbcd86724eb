"""What both halves of a method agree on: its settings (`<method>.*` run-config keys) and its message
contracts. Light modules (pydantic only), imported by the server, the clients and the registry."""
