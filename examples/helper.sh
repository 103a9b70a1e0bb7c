#!/bin/sh
# A minimal choria-provisioner helper: it gives every node the same broker and
# turns provisioning mode off. The node's details arrive as JSON on stdin, the
# reply goes to stdout. See README.md in this directory for the contract.
#
#   BROKER  broker URL(s) for the provisioned nodes
#           (default nats://broker.example.net:4222)

# The provisioner always writes "identity" first, so sed can pick it out of the
# one-line input without a JSON parser. sed reads all of stdin itself, which
# saves starting cat for every node.
identity=$(sed -n 's/^{"identity":"\([A-Za-z0-9._-]*\)".*/\1/p')

if [ -z "$identity" ]; then
  echo "helper.sh: no usable identity in the input" >&2
  exit 1
fi

# printf is a shell builtin: no further processes are started.
printf '{"defer":false,"msg":"configured by examples/helper.sh","configuration":{"identity":"%s","loglevel":"info","plugin.choria.server.provision":"false","plugin.choria.middleware_hosts":"%s"}}\n' \
  "$identity" "${BROKER:-nats://broker.example.net:4222}"
