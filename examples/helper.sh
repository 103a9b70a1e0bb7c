#!/bin/sh
# A minimal choria-provisioner helper: it gives every node the same broker and
# turns provisioning mode off. The node's details arrive as JSON on stdin, the
# reply goes to stdout. See README.md in this directory for the contract.
#
#   BROKER  broker URL(s) for the provisioned nodes
#           (default nats://broker.example.net:4222)

# The provisioner always writes "identity" first, on one line without a
# trailing newline, so shell builtins can cut it out without a JSON parser —
# and without starting any other process, which matters when this runs for
# thousands of nodes (read fails at the missing newline but fills the line).
IFS= read -r line || true
rest=${line#'{"identity":"'}
identity=${rest%%'"'*}

case "$identity" in
  "" | *[!A-Za-z0-9._-]* | "$line")
    echo "helper.sh: no usable identity in the input" >&2
    exit 1
    ;;
esac

# printf is a builtin too.
printf '{"defer":false,"msg":"configured by examples/helper.sh","configuration":{"identity":"%s","loglevel":"info","plugin.choria.server.provision":"false","plugin.choria.middleware_hosts":"%s"}}\n' \
  "$identity" "${BROKER:-nats://broker.example.net:4222}"
