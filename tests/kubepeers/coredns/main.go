// Cluster DNS for the node tier (scripts/node-tier.sh): CoreDNS with only the
// plugins a cluster's Service names need (bind, errors, kubernetes), run on the host
// against the tier's API server. A main of our own rather than CoreDNS's, whose
// import of every plugin would build the clients of every cloud.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() {
	dnsserver.Directives = []string{"bind", "errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
